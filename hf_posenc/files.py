"""Writing files so that a run killed at any moment leaves the previous or the new version, never half; JSON that
every reader parses."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None


def default_output(kind: str, *names: str | None) -> Path:
    """``hf-posenc-results/<kind>-<names>``: a command's results folder when ``--output`` is not given."""
    slug = "-".join(re.sub(r"[^A-Za-z0-9._]+", "_", Path(n).name) for n in names if n)
    return Path("hf-posenc-results") / f"{kind}-{slug}"


def refuse_dangling_link(folder: Path, name: str = "output") -> None:
    """Raise ``ValueError`` if the output folder ``folder`` is a link to nothing (making it would fail with "File
    exists"); ``name`` names it in the message."""
    if folder.is_symlink() and not folder.exists():
        raise ValueError(
            f"`{name}` {folder} is a link to {os.readlink(folder)}, which does not exist; create that folder or "
            f"choose another `{name}`."
        )


def nearest_existing(folder: Path, name: str = "output") -> Path:
    """``folder``, or the nearest of its parents that exists: where making it starts (a file there stops it).
    Raises ``ValueError`` if ``folder`` is a link to nothing (:func:`refuse_dangling_link`)."""
    refuse_dangling_link(folder, name)
    return next(path for path in (folder, *folder.absolute().parents) if path.exists())


CHECK_PREFIX = ".hf-posenc-check-"  # the folders write_problem makes and removes


def write_problem(folder: Path) -> str | None:
    """Why nothing can be made in the existing folder ``folder`` (the system's reason), or None: a folder is made
    there and removed to find out (permissions alone mislead root, and know nothing of a read-only mount's)."""
    try:
        os.rmdir(tempfile.mkdtemp(dir=folder, prefix=CHECK_PREFIX))
    except OSError as error:
        return error.strerror
    return None


def same_place(one: str, other: str) -> bool:
    """Whether two spellings of a local path (``texts/``, ``./texts``, absolute) name the same existing file or
    folder; names of nothing here (a Hub id) are the same only as equal strings."""
    if one == other:
        return True
    try:
        return Path(one).exists() and Path(other).exists() and Path(one).resolve() == Path(other).resolve()
    except OSError:  # a name too long for a path, say: not one
        return False


def _temporary(path: Path) -> Path:
    """Where :func:`atomic_write` writes ``path`` first: ``.name.<32 hex>.suffix`` beside it."""
    return path.with_name(f".{path.stem}.{uuid.uuid4().hex}{path.suffix}")


STALE_AFTER = 600.0  # seconds unchanged after which a leftover temporary file or check folder is a killed run's


def stale(path: Path) -> bool:
    """Whether ``path`` has not changed for :data:`STALE_AFTER` seconds: a temporary file another run is writing, or
    a check folder it is making, is younger. This holds where locks do not: NFS turns ``flock`` into byte-range
    locks, which a reader cannot take and which a writer loses on closing any descriptor of the file. Its age is
    taken on the clock that stamped it, the file system's (:func:`_now_in`): an NFS server's may differ from this
    machine's by more than :data:`STALE_AFTER`."""
    try:
        return _now_in(path.parent) - path.stat().st_mtime > STALE_AFTER
    except OSError:  # gone since
        return False


def _now_in(folder: Path) -> float:
    """The time now on the clock that stamps files in ``folder``: the modification time of a file made there (at
    once without a name where the system can, else removed when closed); this machine's where none can be made."""
    try:
        with tempfile.TemporaryFile(dir=folder) as probe:
            return os.fstat(probe.fileno()).st_mtime
    except OSError:  # a folder this run cannot write to
        return time.time()


def remove_temporaries(path: Path) -> None:
    """Remove the temporary files a killed :func:`atomic_write` of ``path`` left beside it (none other), but not one
    another run is writing now: it holds a lock on it (which the system releases when that run is killed), and it
    is not :func:`stale`."""
    if not path.parent.is_dir():
        return
    pattern = re.compile(rf"\.{re.escape(path.stem)}\.[0-9a-f]{{32}}{re.escape(path.suffix)}")
    for leftover in path.parent.iterdir():
        if leftover.is_file() and pattern.fullmatch(leftover.name) and stale(leftover):
            try:
                handle = os.open(leftover, os.O_RDONLY)
            except OSError:  # gone since, or not ours to read
                continue
            try:
                if _locked(handle, blocking=False):
                    leftover.unlink(missing_ok=True)
            finally:
                os.close(handle)


def try_lock(path: Path) -> int | None:
    """An open handle of ``path`` (made if missing) holding an exclusive lock on it, or None where another process
    (or another handle) holds one. Closing the handle releases it; so does the end of its process."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # written to open: NFS locks need it
    if _locked(handle, blocking=False):
        return handle
    os.close(handle)
    return None


def lock_is_held(path: Path) -> bool:
    """Whether another handle holds an exclusive lock on ``path`` (:func:`try_lock`). Asked with a shared lock, so
    that processes asking at once do not see one another's question as a lock."""
    try:
        handle = os.open(path, os.O_RDONLY)
    except OSError:  # none, gone since, or not ours to read
        return False
    try:
        return not _locked(handle, blocking=False, shared=True)
    finally:
        os.close(handle)


def _locked(handle: int, blocking: bool = True, shared: bool = False) -> bool:
    """An advisory lock on the open file ``handle``, exclusive unless ``shared`` (released when it is closed, or its
    process dies): whether it was taken. Where the system has none (Windows), every lock is taken."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(handle, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    except OSError:  # a file system without locks: as if there were none
        pass
    return True


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then move it onto ``path`` (:func:`os.replace`).
    A file replaced keeps its permissions (results someone restricted stay restricted, a read-only one stays
    read-only); a folder that takes no file raises ``OSError`` naming ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    try:
        handle = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # mode 0666 & ~umask, as a new file gets
    except OSError as error:  # named by the file asked for, not the temporary one
        raise OSError(error.errno, f"Cannot write {path} (in {path.parent}): {error.strerror}") from None
    try:
        _locked(handle)  # held while it is written: another run's remove_temporaries passes it over
        write(tmp)
        if path.exists():  # after writing: a read-only file's mode would stop the write
            shutil.copymode(path, tmp)
        os.replace(tmp, path)
    finally:
        os.close(handle)
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def json_text(value: Any) -> str:
    """``value`` as standard JSON text (indented, newline-terminated). ``NaN`` and ``Infinity`` are not JSON (RFC
    8259: strict parsers such as JavaScript's ``JSON.parse``, jq and Go refuse the file), so a non-finite float is
    written as ``null``: a writer that needs to say which one marks it beside (a row's ``status``)."""
    return json.dumps(json_safe(value), indent=2, allow_nan=False) + "\n"


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float, at any depth, as None (what :func:`json_text` writes)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value
