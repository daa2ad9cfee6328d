"""Ctrl-C while the ``hf-posenc`` command starts: one line and exit 130, as during a run, not a traceback.

Importing hf_posenc imports torch and transformers and registers its methods with transformers (seconds);
a command interrupted then has run and written nothing. Only the command's own process is quieted: a
program that imports hf_posenc keeps its ``KeyboardInterrupt``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

INTERRUPTED_EXIT = 130  # 128 + SIGINT, as a shell reports a command killed by Ctrl-C
STARTING = "interrupted while starting; nothing was run or written."


def is_command() -> bool:
    """Whether this process is the ``hf-posenc`` command: its console script, or ``python -m hf_posenc`` (and
    ``accelerate launch -m hf_posenc``), whose ``sys.argv[0]`` is ``-m`` while the package is imported."""
    argv = getattr(sys, "argv", None) or [""]
    return os.path.splitext(os.path.basename(argv[0]))[0] in ("hf-posenc", "-m")


@contextlib.contextmanager
def quiet_interrupt(prefix: str = "hf-posenc") -> Iterator[None]:
    """Turn a ``KeyboardInterrupt`` inside the block into ``SystemExit(130)`` and one line on stderr, in the
    command's process only."""
    try:
        yield
    except KeyboardInterrupt:
        if not is_command():
            raise
        print(f"{prefix}: {STARTING}", file=sys.stderr)
        raise SystemExit(INTERRUPTED_EXIT) from None
