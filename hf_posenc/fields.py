"""Dataclass fields that carry their own help, written once for the docstring, the command line and the docs.

>>> @documented
... @dataclass(frozen=True)
... class Settings:
...     steps: int = setting(help="optimizer steps")
>>> field_help(Settings)["steps"]
'optimizer steps'
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any, TypeVar

T = TypeVar("T")
_HELP = "help"


def setting(default: Any = dataclasses.MISSING, *, help: str) -> Any:  # noqa: A002 (argparse's and peft's name)
    """A dataclass field with ``default`` (none: required) and its ``help``, one short paragraph."""
    return dataclasses.field(default=default, metadata={_HELP: help})


def field_help(cls: type) -> dict[str, str]:
    """Each field of the dataclass ``cls`` that has help -> its help, in field order (inherited fields first)."""
    return {item.name: item.metadata[_HELP] for item in dataclasses.fields(cls) if _HELP in item.metadata}


def documented(cls: type[T]) -> type[T]:
    """Class decorator: the docstring of the dataclass ``cls`` gains an ``Args:`` section built from its fields'
    help (Hugging Face style: ``name (`type`, defaults to X): help``)."""
    lines = []
    for item in dataclasses.fields(cls):
        if _HELP not in item.metadata:
            continue
        kind = item.type if isinstance(item.type, str) else getattr(item.type, "__name__", str(item.type))
        default = "" if item.default is dataclasses.MISSING else f", defaults to `{item.default!r}`"
        entry = f"{item.name} (`{kind}`{default}): {item.metadata[_HELP]}"
        lines.append(textwrap.fill(entry, width=112, initial_indent="    ", subsequent_indent="        "))
    if lines:
        cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n\nArgs:\n" + "\n".join(lines) + "\n"
    return cls
