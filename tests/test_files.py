"""Atomic writes: a killed writer leaves the previous file; permissions as a new file or the replaced one."""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

import pytest

from hf_posenc.files import STALE_AFTER, atomic_write, atomic_write_text, remove_temporaries


def test_a_writer_killed_midway_leaves_the_previous_file(tmp_path):
    path = tmp_path / "results.json"
    atomic_write_text(path, "old")

    def crash(tmp: Path) -> None:
        tmp.write_text("half a fi")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, crash)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_written_files_get_the_usual_permissions(tmp_path, umask):
    before = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "results.json", "{}")
    finally:
        os.umask(before)
    assert (tmp_path / "results.json").stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_read_only_file_is_replaced_and_stays_read_only(tmp_path):
    """The temporary file is written before it takes the target's mode: a 0444 target's mode taken first would make
    it unwritable, and any user but root get "Permission denied" naming the hidden temporary file (after plot wrote
    its PNG)."""
    path = tmp_path / "frequencies.csv"
    atomic_write_text(path, "old")
    path.chmod(0o444)

    def write(tmp):
        assert tmp.stat().st_mode & 0o200, "the temporary file is read-only while it is written"
        tmp.write_text("new")

    atomic_write(path, write)
    assert path.read_text() == "new" and path.stat().st_mode & 0o777 == 0o444


def test_a_folder_that_takes_no_file_is_named_in_the_error(tmp_path, monkeypatch):
    def refuse(*args):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(OSError, match=rf"^\[Errno 13\] Cannot write {tmp_path / 'results.json'} \(in {tmp_path}\)"):
        atomic_write_text(tmp_path / "results.json", "{}")


def test_a_replaced_file_keeps_its_permissions(tmp_path):
    path = tmp_path / "results.json"
    atomic_write_text(path, "{}")
    path.chmod(0o600)
    atomic_write_text(path, '{"results": []}')
    assert path.stat().st_mode & 0o777 == 0o600 and path.read_text() == '{"results": []}'


def test_a_temporary_another_run_is_writing_is_not_removed_as_a_leftover(tmp_path):
    """A run starting on a folder removes what a killed run left there, but not the temporary file another run is
    writing at that moment (removed, that run would fail with "No such file or directory")."""
    path = tmp_path / "ppl_vs_length.png"

    def write(tmp):
        _age(tmp)  # older than STALE_AFTER (a writer suspended a while): its lock alone keeps it
        remove_temporaries(path)  # another run starts on the folder meanwhile
        assert tmp.exists()
        tmp.write_bytes(b"new")

    atomic_write(path, write)
    assert path.read_bytes() == b"new"
    leftover = tmp_path / ".ppl_vs_length.0123456789abcdef0123456789abcdef.png"  # a killed run's: no lock held
    leftover.write_bytes(b"half")
    remove_temporaries(path)
    assert leftover.exists()  # younger than STALE_AFTER: maybe written now where locks do not hold (NFS)
    _age(leftover)
    remove_temporaries(path)
    assert not leftover.exists()


def test_a_leftovers_age_is_taken_on_the_file_systems_clock(tmp_path, monkeypatch):
    """A machine whose clock runs an hour ahead of the file server's (NFS) takes files written just now as an hour
    old: its age is taken on the server's clock, the modification time of a file made there, so a temporary written
    now is kept and one left an hour ago on that clock removed."""
    import hf_posenc.files as files

    path = tmp_path / "results.json"
    young = tmp_path / ".results.0123456789abcdef0123456789abcdef.json"
    young.write_bytes(b"being written")
    real = time.time
    monkeypatch.setattr(files.time, "time", lambda: real() + 3600)
    remove_temporaries(path)
    assert young.exists()
    then = real() - STALE_AFTER - 1  # older than STALE_AFTER on the file system's clock
    os.utime(young, (then, then))
    remove_temporaries(path)
    assert not young.exists()


def _age(path, seconds=STALE_AFTER + 1):
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_temporary_being_written_where_locks_do_not_hold_is_not_removed(tmp_path, monkeypatch):
    """On NFS ``flock`` is a byte-range lock that a file opened to read cannot take (EBADF), and that the writer loses
    when it closes any descriptor of the file, as ``write_text`` does: the lock cannot tell a live temporary file
    from a killed run's, its age can: another run's start does not remove it under the writing run."""
    path = tmp_path / "passkey.json"
    real_flock = fcntl.flock

    def nfs_flock(handle, operation):
        if os.fstat(handle).st_size and operation & fcntl.LOCK_EX:  # the remover: a written file opened to read
            raise OSError(errno.EBADF, "Bad file descriptor")
        real_flock(handle, operation)

    monkeypatch.setattr(fcntl, "flock", nfs_flock)

    def write(tmp):
        tmp.write_text("{}")
        remove_temporaries(path)  # another run starts on the folder before this one moves its file in place

    atomic_write(path, write)
    assert path.read_text() == "{}"
