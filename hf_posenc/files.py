"""Writing files so that a run killed at any moment leaves the previous or the new version, never half."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then move it onto ``path`` (:func:`os.replace`).
    A file replaced keeps its permissions (results someone restricted stay restricted)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{uuid.uuid4().hex}{path.suffix}")
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
