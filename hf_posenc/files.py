"""Writing files so that a run killed at any moment leaves the previous or the new version, never half."""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path


def _temporary(path: Path) -> Path:
    """Where :func:`atomic_write` writes ``path`` first: ``.name.<32 hex>.suffix`` beside it."""
    return path.with_name(f".{path.stem}.{uuid.uuid4().hex}{path.suffix}")


def remove_temporaries(path: Path) -> None:
    """Remove the temporary files a killed :func:`atomic_write` of ``path`` left beside it (none other)."""
    if not path.parent.is_dir():
        return
    pattern = re.compile(rf"\.{re.escape(path.stem)}\.[0-9a-f]{{32}}{re.escape(path.suffix)}")
    for leftover in path.parent.iterdir():
        if leftover.is_file() and pattern.fullmatch(leftover.name):
            leftover.unlink(missing_ok=True)


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then move it onto ``path`` (:func:`os.replace`).
    A file replaced keeps its permissions (results someone restricted stay restricted)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # mode 0666 & ~umask, as a new file gets
    try:
        if path.exists():
            shutil.copymode(path, tmp)
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
