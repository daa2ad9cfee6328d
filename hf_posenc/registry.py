"""Method registry: name -> :class:`Method`, with aliases. Registering a name twice is an error."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

FrequencyFn = Callable[..., tuple[torch.Tensor, float]]
TransformersRopeFn = Callable[[Any, int, float], "dict[str, Any] | None"]


@dataclass(frozen=True)
class Method:
    """A position-encoding method: its parameters, its math and how transformers can say it.

    Attributes:
        name (`str`): canonical name (``"yarn"``).
        params (`type`): frozen, keyword-only dataclass of the method's parameters; validates in
            ``__post_init__``.
        frequencies (`Callable`, *optional*): RoPE methods' pure math, ``fn(params, *, head_dim, base,
            seq_len, dtype, device) -> (inv_freq, attention_factor)``; ``inv_freq`` has ``head_dim // 2``
            entries. ``None`` for methods that replace RoPE rather than rescale it (ALiBi).
        transformers_rope (`Callable`, *optional*): ``fn(params, head_dim, base) -> rope_parameters`` in
            transformers' own vocabulary (without ``rope_theta`` unless the method changes it), or ``None`` (the
            function, or its result for some parameters) where transformers cannot express the method.
        dynamic (`bool`): the frequencies depend on the current sequence length.
        depends_on_length (`bool`, defaults to `True`): the output at a position may depend on the input's
            total length, not only on the tokens up to it (dynamic methods; LongRoPE switches factors at
            ``L``). When `False`, the first ``n`` positions of one forward are exactly a forward of the first
            ``n`` tokens, so evaluation reads every shorter window from the longest. Defaults to the safe
            answer: a method must say it does not.
        unchanged_within_context (`bool`): for ``seq_len <= original_max_position_embeddings`` the
            method is the unpatched model exactly (dynamic NTK, dynamic YaRN).
        applies_to (`frozenset[str]`): position kinds it patches (``"rope"``, ``"learned"``).
        paper (`str`): reference, shown in errors, the README and model cards.
        summary (`str`): one line on when to use it.
    """

    name: str
    params: type
    frequencies: FrequencyFn | None = None
    transformers_rope: TransformersRopeFn | None = None
    dynamic: bool = False
    depends_on_length: bool = True
    unchanged_within_context: bool = False
    applies_to: frozenset[str] = frozenset({"rope"})
    aliases: tuple[str, ...] = ()
    paper: str = ""
    summary: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.dynamic and not self.depends_on_length:
            raise ValueError(f"Method {self.name!r} is dynamic, so its output depends on the input's length.")

    def make_params(self, **kwargs: Any) -> Any:
        """Build (and so validate) the parameters; unknown names raise with the valid ones listed."""
        names = [f.name for f in dataclasses.fields(self.params)]
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            raise TypeError(
                f"Unknown parameter(s) {', '.join(map(repr, unknown))} for method {self.name!r}. "
                f"Valid parameters: {', '.join(names)}."
            )
        try:
            return self.params(**kwargs)
        except TypeError as error:  # a required parameter is missing
            message = str(error).rstrip(".")
            raise TypeError(f"Method {self.name!r}: {message}. Valid parameters: {', '.join(names)}.") from None


def params_to_dict(params: Any) -> dict[str, Any]:
    """A method's params dataclass as JSON-ready values (tuples become lists)."""
    values = {item.name: getattr(params, item.name) for item in dataclasses.fields(params)}
    return {key: list(value) if isinstance(value, tuple) else value for key, value in values.items()}


_METHODS: dict[str, Method] = {}
_ALIASES: dict[str, str] = {}


def register(method: Method) -> Method:
    """Add ``method`` under its name and aliases; a name already taken raises ``ValueError``."""
    for name in (method.name, *method.aliases):
        if name in _METHODS or name in _ALIASES:
            raise ValueError(f"Method name {name!r} is already registered.")
    _METHODS[method.name] = method
    _ALIASES.update({alias: method.name for alias in method.aliases})
    return method


def get_method(name: str) -> Method:
    """The registered method called ``name`` (or an alias of it)."""
    if not isinstance(name, str):
        raise TypeError(f"A method name must be a string, got {type(name).__name__}: {name!r}.")
    key = name.strip().lower().replace("_", "-")
    key = _ALIASES.get(key, key)
    if key not in _METHODS:
        raise ValueError(f"Unknown method {name!r}. Available methods: {', '.join(available_methods())}.")
    return _METHODS[key]


def available_methods() -> list[str]:
    """Canonical names of all registered methods, sorted."""
    return sorted(_METHODS)


def methods_for(kind: str) -> list[str]:
    """Names of the methods that patch position encodings of ``kind`` (``"rope"``, ``"learned"``)."""
    return sorted(name for name, method in _METHODS.items() if kind in method.applies_to)
