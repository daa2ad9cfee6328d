"""What importing hf_posenc checks and how it ends: the transformers floor, and Ctrl-C while the ``hf-posenc``
command starts (one line and exit 130, as during a run, not a traceback).

Importing hf_posenc imports torch and transformers and registers its methods with transformers (seconds);
a command interrupted then has run and written nothing. The command itself imports them only once its
arguments are parsed, so that ``--help`` and a mistyped option answer at once. Only the command's own process is
quieted: a program that imports hf_posenc keeps its ``KeyboardInterrupt``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# pyproject.toml declares the same (tests/test_transformers_floor.py checks that both say it).
TRANSFORMERS_FLOOR = "5.18.0"
INTERRUPTED_EXIT = 130  # 128 + SIGINT, as a shell reports a command killed by Ctrl-C
STARTING = "interrupted while starting; nothing was run or written."


def is_command() -> bool:
    """Whether this process is the ``hf-posenc`` command: its console script, or ``python -m hf_posenc`` (as
    ``accelerate launch -m hf_posenc`` runs it), told from the interpreter's own command line."""
    argv = getattr(sys, "argv", None) or [""]
    if os.path.splitext(re.split(r"[\\/]", argv[0])[-1])[0].lower() == "hf-posenc":
        return True
    return _module_run(list(getattr(sys, "orig_argv", []))[1:]) == "hf_posenc"


def _module_run(options: list[str]) -> str | None:
    """The module of ``python [options] -m MODULE``, or None for a script, ``-c`` or the interactive prompt."""
    index = 0
    while index < len(options):
        option = options[index]
        if option.startswith("-m"):
            return option[2:] or (options[index + 1] if index + 1 < len(options) else None)
        if not option.startswith("-") or option == "-" or option.startswith("-c"):
            return None
        index += 2 if option in ("-X", "-W", "--check-hash-based-pycs") else 1
    return None


@contextlib.contextmanager
def quiet_interrupt() -> Iterator[None]:
    """Turn a ``KeyboardInterrupt`` inside the block into ``SystemExit(130)`` and one line on stderr, in the
    command's process only."""
    try:
        yield
    except KeyboardInterrupt:
        if not is_command():
            raise
        print(f"hf-posenc: {STARTING}", file=sys.stderr)
        raise SystemExit(INTERRUPTED_EXIT) from None


def require_transformers() -> None:
    """``ImportError`` naming the floor where an older transformers would be imported (a ``PYTHONPATH`` or a pin past
    pip's resolver): transformers 4 keeps RoPE parameters elsewhere, and every patch would fail on a misleading
    message. Read from the installed package's metadata, without importing it (seconds)."""
    from importlib import metadata, util

    from packaging.version import Version

    spec = util.find_spec("transformers")
    if spec is None:
        return  # the import that needs it says so
    try:
        version = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return
    if Version(version) < Version(TRANSFORMERS_FLOOR):
        folder = Path(spec.origin).parent if spec.origin else Path(next(iter(spec.submodule_search_locations)))
        raise ImportError(
            f"hf_posenc needs transformers>={TRANSFORMERS_FLOOR}; this Python imports transformers "
            f"{version} from {folder}. Upgrade it: pip install 'transformers>={TRANSFORMERS_FLOOR},<6'."
        )


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` for names (``exports``: name -> the module defining it, relative
    to ``package``) imported on first use, so that importing one light module of the package does not import torch.
    """

    def getattr_(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return getattr_, dir_
