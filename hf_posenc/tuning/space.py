"""The candidates a tune measures: for a model trained on ``L`` tokens and a target ``T``, the settings of every
training-free family that take it to ``T``, from ``L``, ``T`` and each method's own rules.

Each family gives a few settings, its most promising first; with log-n a second copy of each where the combination
is allowed. A setting whose reach (Self-Extend's ``(L - W) G + W``, STRING's ``L + S - W``) falls short of ``T`` is
left out, checked by the method's own parameters with the model's ``L`` filled in. Pure: no model is loaded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..methods.string_rope import LOCAL_VALUE  # the STRING authors' W
from ..registry import get_method
from ..spec import MethodSpec, format_method_spec

LOGN = "logn"


@dataclass(frozen=True)
class Candidate:
    """One setting a tune measures.

    Attributes:
        spec (`MethodSpec`): the method and its parameters (the trained context left for the model to fill in).
        family (`str`): the family it belongs to (``yarn``; ``yarn+logn`` with log-n).
    """

    spec: MethodSpec
    family: str

    @property
    def text(self) -> str:
        return self.spec.text


def _factor(trained: int, target: int) -> float:
    """``T / L`` rounded up to a hundredth: a RoPE scaling by it reaches ``T``."""
    return math.ceil(target / trained * 100) / 100


def _scalings(steps: Sequence[float]) -> Callable[[int, int], list[dict]]:
    """RoPE scalings: the factor ``T / L`` and the next step up (YaRN paper §3: ``s = L' / L``)."""
    return lambda trained, target: [{"factor": _factor(trained, target) * step} for step in steps]


def _self_extend(trained: int, target: int) -> list[dict]:
    """Jin et al. 2024 §3: the window ``L / 4``, the smallest power-of-two group size that reaches ``T`` (their
    README's rule), and the next one."""
    smallest = (target - trained // 4) / (trained - trained // 4)
    group = 2 ** max(1, math.ceil(math.log2(smallest)))
    return [{"group_size": g, "window": max(g, trained // 4 // g * g)} for g in (group, 2 * group)]


def _dca(trained: int, target: int) -> list[dict]:
    """An et al. 2024: the defaults (chunks of ``3L/4``, local ``L/16``), and chunks of ``L/2``."""
    return [{}, {"chunk_size": trained // 2}]


def _string(trained: int, target: int) -> list[dict]:
    """An et al. 2025 §4: ``S = 0.33 L`` (or the smallest that reaches ``T``), ``W = 128``."""
    offset = max(int(0.33 * trained), target - trained + LOCAL_VALUE)
    return [{"shifted_offset": offset}] if offset < trained else []


def _rerope(trained: int, target: int) -> list[dict]:
    """Su 2023: the window ``L / 8`` (the authors' 512 of 4096) and ``L / 4``."""
    return [{}, {"window": trained // 4}]


def _leaky_rerope(trained: int, target: int) -> list[dict]:
    """Su 2023: the window ``L / 8``, ``k`` so that ``T``'s farthest pair sits at ``L - 1``."""
    return [{"max_position_embeddings": target}]


# The training-free families, the most promising first (the order a budget keeps without screening), each with
# its settings for (L, T).
FAMILIES: dict[str, Callable[[int, int], list[dict]]] = {
    "yarn": _scalings((1, 2)),
    "dynamic-yarn": lambda trained, target: [{}],
    "self-extend": _self_extend,
    "dca": _dca,
    "string": _string,
    "ntk": _scalings((1, 2)),
    "dynamic-ntk": _scalings((1,)),
    "rerope": _rerope,
    "leaky-rerope": _leaky_rerope,
}


def check_families(names: Sequence[str]) -> list[str]:
    """``names`` as canonical family names; ``ValueError`` naming one that is not a training-free family."""
    families = []
    for name in names:
        method = get_method(name).name  # an unknown method: the registry's error, naming the available ones
        if method not in FAMILIES:
            raise ValueError(
                f"`methods` {name!r} is no training-free family a tune searches; choose from {', '.join(FAMILIES)}."
            )
        families.append(method)
    return list(dict.fromkeys(families))


def _reaches(name: str, params: dict, trained: int, target: int) -> bool:
    """Whether ``name`` with ``params`` on a model trained on ``trained`` serves ``target`` tokens: its own checks
    with the reach asked for (methods with a ``max_position_embeddings``) or the scaled length (a factor)."""
    method = get_method(name)
    names = set(method.param_names)
    given = {**params, "original_max_position_embeddings": trained}
    if "max_position_embeddings" in names and "max_position_embeddings" not in params and "factor" not in names:
        given["max_position_embeddings"] = target
    try:
        method.make_params(**given)
    except ValueError:
        return False
    return "factor" not in params or params["factor"] * trained >= target


def search_space(
    trained: int, target: int, families: Sequence[str] | None = None, logn: bool = True
) -> list[Candidate]:
    """Every candidate of ``families`` (None: all of :data:`FAMILIES`) that takes a model trained on ``trained``
    tokens to ``target``, in order of promise, each with log-n after it where ``logn`` and the combination is
    allowed.

    Raises:
        ValueError: ``target`` is not past ``trained``, or a family is unknown.
    """
    if target <= trained:
        raise ValueError(
            f"The target length {target} is inside the trained context {trained}: nothing to extend; give a longer "
            "target."
        )
    candidates = []
    for family in check_families(families) if families is not None else list(FAMILIES):
        for params in FAMILIES[family](trained, target):
            if not _reaches(family, params, trained, target):
                continue
            candidates.append(Candidate(MethodSpec.parse(format_method_spec(family, params)), family))
            if logn and _combines_with_logn(family):
                combined = f"{family}+{LOGN}"
                candidates.append(Candidate(MethodSpec.parse(format_method_spec(combined, params)), combined))
    return candidates


def _combines_with_logn(family: str) -> bool:
    try:
        get_method(f"{family}+{LOGN}")
    except ValueError:
        return False
    return True
