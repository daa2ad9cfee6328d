"""Method specifications as written on a command line (``name`` or ``name:key=value,...``), parsed once.

A :class:`MethodSpec` is built from the text once, checked against the registry (the method exists,
its parameters build) and passed on: its text names result rows, its identity tells two spellings of
one method apart from two methods.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .registry import get_method, params_to_dict

NONE_METHOD = "none"


@dataclass(frozen=True)
class MethodSpec:
    """A method and its parameters as asked for, e.g. ``yarn:factor=4``.

    Attributes:
        name (`str`): the name as written (an alias stays an alias: ``linear``); ``"none"`` is the
            unpatched model.
        params (`dict`): the parameters as written, values parsed (numbers, booleans, lists).
        method (`str`): the registered method's canonical name (``pi`` for ``linear``), or ``"none"``.
        built: the parameters as its params dataclass built (so checked) them when parsed, which ``patch`` takes;
            what the model decides (the trained context when not given) stays unset. None for ``none``.
    """

    name: str
    params: dict[str, Any]
    method: str = field(compare=False)
    built: Any = field(compare=False, repr=False)

    def __reduce__(self):  # pickled as its text: a combination's params class is made at run time
        return _parsed, (self.text,)

    @property
    def defaults(self) -> dict[str, Any]:
        """Every parameter of the method, the given ones and the defaults, as built (empty for ``none``)."""
        return {} if self.built is None else params_to_dict(self.built)

    @classmethod
    def parse(cls, text: str, *, parameter: str = "method") -> MethodSpec:
        """Parse and check ``text``; ``ValueError`` naming the specification when it does not parse, names an
        unknown method or parameter, or has a bad value. ``parameter``: the name of the argument ``text`` came
        in, which the error names (in backticks, see :mod:`hf_posenc.cli`)."""
        name, params = parse_method_spec(text)
        if name == NONE_METHOD:
            if params:
                raise ValueError(f"`{parameter}` {text!r}: 'none' is the unpatched model and takes no parameters.")
            return cls(NONE_METHOD, {}, NONE_METHOD, None)
        method = get_method(name)  # raises naming the unknown method and the available ones (aliases accepted)
        try:
            built = method.make_params(**params)
        except (TypeError, ValueError) as error:
            raise ValueError(f"`{parameter}` {text!r}: {error}") from None
        return cls(name, params, method.name, built)

    @property
    def text(self) -> str:
        """The canonical spelling: what result rows are keyed by (``yarn:factor=4``)."""
        return format_method_spec(self.name, self.params)

    @property
    def unpatched(self) -> bool:
        return self.method == NONE_METHOD

    def identity(self, resolved: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """``(method, parameters)``, equal for specs that compute the same thing: ``pi:factor=2`` and
        ``linear:factor=2.0``. With ``resolved`` (the parameters a model resolved for it, its trained context
        filled in), ``yarn:factor=4`` and ``yarn:factor=4,original_max_position_embeddings=8192`` are one
        method on a model trained on 8192, and the ALiBi backend, which does not change the numbers, is left
        out (without ``resolved`` two backends stay two methods: a run may compare their speed)."""
        if resolved is None:
            return self.method, dict(self.defaults)
        return self.method, {key: value for key, value in resolved.items() if key != "backend"}


def _parse_value(text: str) -> Any:
    """``4`` -> 4, ``0.5`` -> 0.5, ``true`` -> True, ``[1,2]`` -> [1, 2], ``nan`` / ``inf`` -> floats (which the
    method then refuses by name); anything else stays a string."""
    stripped = text.strip()
    if stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    if stripped.lower().lstrip("+-") in ("nan", "inf", "infinity"):
        return float(stripped)
    try:
        return json.loads(stripped)
    except json.JSONDecodeError:
        return stripped


def parse_method_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Split ``"yarn:factor=4,beta_fast=32"`` into ``("yarn", {"factor": 4, "beta_fast": 32})``.

    List values are written in brackets: ``longrope:factor=2,long_factor=[1,1.5,2]``.
    ``"none"`` means the unpatched model. Raises ``ValueError`` naming the part that does not parse.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"Empty method specification {spec!r}; expected 'name' or 'name:key=value,...'.")
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    if not name:
        raise ValueError(f"Method specification {spec!r} has no method name before ':'.")
    params: dict[str, Any] = {}
    for item in _split_top_level(rest):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key or not value.strip():
            raise ValueError(f"Cannot parse {item!r} in method specification {spec!r}; expected key=value.")
        if key in params:
            raise ValueError(f"Parameter {key!r} is given twice in method specification {spec!r}.")
        params[key] = _parse_value(value)
    return name, params


def format_method_spec(name: str, params: Mapping[str, Any]) -> str:
    """Inverse of :func:`parse_method_spec` (parameters in the given order)."""
    if not params:
        return name
    return name + ":" + ",".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in params.items())


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    items, depth, current = [], 0, []
    for char in text:
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    if current or items:
        items.append("".join(current))
    return [item for item in items if item.strip()] if text.strip() else []


def _parsed(text: str) -> MethodSpec:
    """The :class:`MethodSpec` of ``text`` (how a pickled spec is read back)."""
    return MethodSpec.parse(text)
