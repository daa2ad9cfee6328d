"""Local data files (``.txt``, ``.jsonl`` / ``.json``, ``.parquet``, or a folder of them) read through `datasets`,
and, where it fails, what is wrong with which file: a one-line ``ValueError`` naming it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

LOCAL_SPLIT = "train"
LOCAL_BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def _local_files(path: Path) -> tuple[str, list[Path]]:
    """The `datasets` builder and sorted files for a local file or folder (one file type only, none empty)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in LOCAL_BUILDERS)
    builders = {LOCAL_BUILDERS.get(f.suffix) for f in files}
    if path.is_file() and None in builders:
        raise ValueError(f"{path} is not a {', '.join(LOCAL_BUILDERS)} file; give one of those, or a folder of them.")
    if not files:
        raise ValueError(f"{path} holds no readable files; expected {', '.join(LOCAL_BUILDERS)}.")
    if len(builders) > 1:
        raise ValueError(f"{path} mixes file types {sorted(builders)}; point at one kind of file.")
    empty = next((f for f in files if f.stat().st_size == 0), None)
    if empty is not None:
        raise ValueError(f"{empty} is empty; remove it or point at other files.")
    return builders.pop(), files


def local_rows(path: Path, streaming: bool) -> Iterator[dict]:
    """The rows of a local file or folder; a file `datasets` cannot read, or reads but is binary, is a
    ``ValueError`` naming it and what is wrong with it."""
    builder, files = _local_files(path)
    if builder == "json":
        for file in files:
            _refuse_deep_json(file)
    for index, row in enumerate(_dataset_rows(path, builder, files, streaming)):
        if builder == "text" and "\0" in row["text"]:  # valid UTF-8 all the same; one row per file
            raise ValueError(f"{files[index]} {_file_problem(files[index], builder)}.")
        yield row


MAX_NESTING = 256  # JSON arrays/objects opened in a row; Arrow's JSON reader crashes the process on ~10,000
_DEEP = re.compile(rb"(?:[\[{]\s*){%d}" % MAX_NESTING)
_SCAN = 1 << 24  # bytes read at a time


def _refuse_deep_json(file: Path) -> None:
    """Refuse a JSON file that opens :data:`MAX_NESTING` arrays or objects in a row, before `datasets` reads it:
    Python's parser raises at ~1000 levels, Arrow's crashes the interpreter (a segmentation fault) deeper."""
    with open(file, "rb") as handle:
        tail = b""
        while chunk := handle.read(_SCAN):
            if _DEEP.search(tail + chunk):
                raise ValueError(f"{file} holds JSON nested deeper than {MAX_NESTING} levels: not rows of documents.")
            tail = chunk[-4 * MAX_NESTING :]


def _dataset_rows(path: Path, builder: str, files: list[Path], streaming: bool) -> Iterator[dict]:
    """`datasets`' rows of local ``files``; only the errors it raises reading them are translated."""
    from datasets import DownloadConfig, load_dataset
    from datasets.exceptions import DatasetGenerationError

    # datasets' bar for resolving data files says "Downloading data" even of local ones: an offline run says not so
    download = DownloadConfig(download_desc="Reading local files")
    kwargs = {"data_files": [str(f) for f in files], "split": LOCAL_SPLIT, "download_config": download}
    if builder == "text":
        kwargs["sample_by"] = "document"
    try:
        yield from load_dataset(builder, streaming=streaming, **kwargs)
    except (
        ValueError,
        TypeError,
        OSError,
        RecursionError,
        DatasetGenerationError,
    ) as error:  # ArrowInvalid: ValueError
        found = next(((file, problem) for file in files if (problem := _file_problem(file, builder))), None)
        if found is not None:
            raise ValueError(f"{found[0]} {found[1]}.") from error
        cause = error  # no file to blame: the reader's own reason, under datasets' generic wrapper
        while isinstance(cause, DatasetGenerationError) and (cause.__cause__ or cause.__context__):
            cause = cause.__cause__ or cause.__context__
        reason = (str(cause).splitlines() or [type(cause).__name__])[0]
        raise ValueError(f"The datasets library cannot read {path} as {builder} files: {reason}") from error


def _file_problem(path: Path, builder: str) -> str | None:
    """What makes one local file unreadable as ``builder`` input ("is not UTF-8 text (...)"), or None."""
    if builder == "parquet":
        import pyarrow.parquet

        try:
            pyarrow.parquet.read_metadata(path)
        except (OSError, ValueError) as error:
            return f"is not a Parquet file ({str(error).rstrip('.')})"
        return None
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        return f"is not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}); save it as UTF-8"
    if "\0" in text:
        return f"holds a NUL byte at offset {data.index(0)}: a binary file, or UTF-16 or UTF-32 text, not UTF-8 text"
    if builder != "json":
        return None
    try:
        return _json_problem(text)
    except RecursionError:
        return "holds JSON nested too deep to read"


def _json_problem(text: str) -> str | None:
    """Why ``text`` is neither one JSON document of objects nor JSON Lines (an object a line), or None."""
    try:
        document = json.loads(text)
        is_list = isinstance(document, list)
        rows = [(f"item {i}", row) for i, row in enumerate(document)] if is_list else [("the whole file", document)]
    except json.JSONDecodeError as whole:
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append((f"line {number}", json.loads(line)))
            except json.JSONDecodeError as error:  # a first line that is no JSON alone: a document, its error
                bad, at = (error, number) if rows else (whole, whole.lineno)
                return f"is not JSON: line {at}, column {bad.colno}: {bad.msg}"
    if not rows:
        return "holds no JSON objects"
    where, wrong = next(((where, row) for where, row in rows if not isinstance(row, dict)), (None, None))
    if where is None:
        return None
    kind = {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(wrong), "number")
    return f"holds a JSON {kind} ({where}) where the datasets library reads one object per document"
