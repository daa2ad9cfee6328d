"""What importing hf_posenc checks and how it ends: the transformers floor, and Ctrl-C while the ``hf-posenc``
command starts (one line and exit 130, as during a run, not a traceback).

Importing hf_posenc imports torch and transformers and registers its methods with transformers (seconds);
a command interrupted then has run and written nothing. Only the command's own process is quieted: a
program that imports hf_posenc keeps its ``KeyboardInterrupt``.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

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
    """``ImportError`` naming the floor where an older transformers is imported (a ``PYTHONPATH`` or a pin past
    pip's resolver): transformers 4 keeps RoPE parameters elsewhere, and every patch would fail on a misleading
    message."""
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__) < Version(TRANSFORMERS_FLOOR):
        raise ImportError(
            f"hf_posenc needs transformers>={TRANSFORMERS_FLOOR}; this Python imports transformers "
            f"{transformers.__version__} from {Path(transformers.__file__).parent}. "
            f"Upgrade it: pip install 'transformers>={TRANSFORMERS_FLOOR},<6'."
        )
