"""``hf_posenc.json``: what a pushed or saved repo says of its weights (its own, or a base model's at a commit, and
the GGUF file in it where they are one), beside the config that carries the method; read here, written by
:func:`hf_posenc.hub.push.push_to_hub` and a tune's winner folder."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

from huggingface_hub import hf_hub_download
from huggingface_hub.errors import EntryNotFoundError

from .._version import __version__
from .errors import HubError, call_hub, refuse_missing_folder

METADATA_FILE = "hf_posenc.json"
METADATA_FORMAT = 1


def read_metadata(
    pretrained_model_name_or_path: str,
    *,
    revision: str | None = None,
    token: str | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
) -> dict[str, Any] | None:
    """The ``hf_posenc.json`` record of a repo or folder, or None when it has none (or, offline, when none
    is cached: the regular loading path then reports what is missing).

    Args:
        pretrained_model_name_or_path (`str`): a Hub id or a local folder.
        revision (`str`, *optional*): the repo's branch, tag or commit.
        token (`str`, *optional*): the Hub token.
        cache_dir (`str` or `Path`, *optional*): huggingface_hub's cache.
        local_files_only (`bool`, defaults to `False`): read the cache alone.

    Raises:
        HubError: the Hub refused or failed.
        ValueError: the record is no JSON object, has another format, or is malformed (a config-only record
            naming no base model).
        FileNotFoundError: the name is written as a path, and nothing is there.
    """
    local = Path(pretrained_model_name_or_path)
    if local.is_dir():
        path = local / METADATA_FILE if (local / METADATA_FILE).is_file() else None
    else:
        refuse_missing_folder(pretrained_model_name_or_path)
        action = f"Reading {METADATA_FILE} of {pretrained_model_name_or_path!r}"
        hub_kwargs = dict(revision=revision, token=token, cache_dir=cache_dir, local_files_only=local_files_only)
        path = call_hub(
            lambda: _download_metadata(pretrained_model_name_or_path, **hub_kwargs), HubError, action, token
        )
    if path is None:
        return None
    where = f"{METADATA_FILE} of {pretrained_model_name_or_path!r}"
    try:
        metadata = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{where} is not a JSON file: {error}.") from None
    if not isinstance(metadata, dict):
        raise ValueError(f"{where} holds a JSON {type(metadata).__name__}, not an object.")
    if metadata.get("format") != METADATA_FORMAT:
        raise ValueError(
            f"{where} has format {metadata.get('format')!r}; this hf_posenc ({__version__}) reads format "
            f"{METADATA_FORMAT}. Upgrade hf_posenc."
        )
    if not isinstance(metadata.get("weights"), bool):
        raise ValueError(f"{where} is malformed: 'weights' is {metadata.get('weights')!r}, not true or false.")
    if not metadata["weights"]:
        if not isinstance(metadata.get("base_model"), str) or not metadata["base_model"]:
            raise ValueError(f"{pretrained_model_name_or_path!r} holds no weights and names no base model to load.")
        if not isinstance(metadata.get("base_revision"), str | None):
            raise ValueError(f"{where} is malformed: 'base_revision' is {metadata['base_revision']!r}, not a commit.")
        gguf = metadata.get("base_gguf_file")
        if gguf is not None and (not isinstance(gguf, str) or not _inside(gguf)):
            raise ValueError(f"{where} is malformed: 'base_gguf_file' is {gguf!r}, not a file in the base model.")
    return metadata


def _download_metadata(repo_id: str, **hub_kwargs: Any) -> Path | None:
    """The downloaded ``hf_posenc.json`` of ``repo_id``, or None when it has none."""
    try:
        return Path(hf_hub_download(repo_id, METADATA_FILE, **hub_kwargs))
    except EntryNotFoundError:  # remote 404, or offline without it in the cache
        return None


def _inside(name: str) -> bool:
    """Whether ``name`` is a relative path that stays inside the folder or repo it is read from."""
    path = PurePosixPath(name.replace("\\", "/"))
    return bool(name) and not path.is_absolute() and ".." not in path.parts
