"""Method specifications as written on a command line: ``name`` or ``name:key=value,key=value``."""

from __future__ import annotations

import json
from typing import Any

NONE_METHOD = "none"


def _parse_value(text: str) -> Any:
    """``4`` -> 4, ``0.5`` -> 0.5, ``true`` -> True, ``[1,2]`` -> [1, 2]; anything else stays a string."""
    lowered = text.strip()
    if lowered.lower() in ("true", "false"):
        return lowered.lower() == "true"
    try:
        return json.loads(lowered)
    except json.JSONDecodeError:
        return lowered


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


def format_method_spec(name: str, params: dict[str, Any]) -> str:
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
