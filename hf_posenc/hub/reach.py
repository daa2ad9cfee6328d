"""Whether a Hub model can be read at all, asked before anything is loaded.

With no connection to the Hub (no network, DNS or route) and a model not in the cache, huggingface_hub retries a
download 5 times (~25 s), and transformers then fails with a message that names neither the model nor the reason (with
``HF_HUB_OFFLINE`` set, that message at once). :func:`hub_unreachable` tells both cases, with one HEAD request
without retries, and :func:`require_reachable` fails at once on them, naming the model, its revision and the reason.
A command-line run reads the cache alone once no connection can be made (:func:`cache_only_if_unreachable`), so
that a cached model loads at once there too.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
from huggingface_hub import (
    HfApi,
    constants,
    get_hf_file_metadata,
    get_token,
    hf_hub_download,
    hf_hub_url,
    is_offline_mode,
)
from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
from huggingface_hub.utils import validate_repo_id

from .errors import HubPushError, call_hub, refuse_missing_folder

logger = logging.getLogger("hf_posenc")
CONFIG_FILE = "config.json"
_CACHE_ONLY_SINCE: list[str] = []  # why this run reads the cache alone (cache_only_if_unreachable), while it does
# A model's weights as transformers looks for them first: any one cached means the weights are (a sharded index
# names its shards, which a complete download brought with it).
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def hub_unreachable(
    repo_id: str, revision: str | None = None, *, filename: str = CONFIG_FILE, token: str | bool | None = None
) -> str | None:
    """Why no connection to the Hub can be made (offline mode; no network, DNS or route, a connection that times
    out or a proxy that refuses it: one HEAD request for ``filename`` without retries), or None. Any answer (not
    found, a server error) or a connection that then waits for one is None: the download handles it as ever, its
    retries included.

    Args:
        repo_id (`str`): the Hub model.
        revision (`str`, *optional*): its branch, tag or commit.
        filename (`str`, defaults to ``"config.json"``): the file asked for.
        token (`str` or `bool`, *optional*): the token the request carries, as huggingface_hub takes it.

    Returns:
        `str` or `None`: the reason (with ``HF_HUB_OFFLINE``: that, or why this run reads the cache alone), or None.
    """
    if is_offline_mode():
        return _CACHE_ONLY_SINCE[-1] if _CACHE_ONLY_SINCE else "HF_HUB_OFFLINE is set"
    try:
        get_hf_file_metadata(hf_hub_url(repo_id, filename, revision=revision), token=token)
    except (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.ProxyError) as error:
        return f"{type(error).__name__}: {error}"
    except httpx2.HTTPError:  # an answer, or a connection made that waits for one: for the download to handle
        pass
    return None


@contextmanager
def cache_only_if_unreachable(
    name: str | None, revision: str | None = None, *, dataset: bool = False
) -> Iterator[str | None]:
    """For a command-line run that reads the Hub model (or ``dataset``) ``name``: where ``HF_HUB_OFFLINE`` is not set
    and no connection to the Hub can be made (:func:`hub_unreachable`), huggingface_hub reads its cache alone inside
    the block, as ``HF_HUB_OFFLINE=1`` would, with a warning. A cached model then loads at once rather than after
    huggingface_hub's retries of a download (about 25 s), and one not cached fails at once (:func:`require_reachable`,
    naming the connection error). A dataset: `datasets`, which reads the setting once when imported, reads the cache
    alone too (also where this run's model block set it). Offline mode is restored after the block.

    Args:
        name (`str` or `None`): the Hub id read; None, a local path or a name no repo can have: nothing changes.
        revision (`str`, *optional*): its branch, tag or commit.
        dataset (`bool`, defaults to `False`): ``name`` is a dataset: `datasets` reads the cache alone too.

    Yields:
        `str` or `None`: why the Hub cannot be reached, or None.
    """
    reason = hub_unreachable(name, revision) if _hub_repo(name) else None
    if reason is None:
        yield None
        return
    with contextlib.ExitStack() as held:  # each setting put back as it was made, also if a later one fails
        if not is_offline_mode():
            logger.warning(
                "hf_posenc: the Hub cannot be reached (%s): this run reads huggingface_hub's cache alone, as "
                "HF_HUB_OFFLINE=1 would (set it to skip this check).",
                reason,
            )
            held.callback(setattr, constants, "HF_HUB_OFFLINE", False)
            held.callback(_CACHE_ONLY_SINCE.pop)
            if "datasets.config" not in sys.modules:  # imported in the block, it would read offline mode for good
                held.callback(_datasets_online)
            constants.HF_HUB_OFFLINE = True
            _CACHE_ONLY_SINCE.append(reason)
        if dataset:
            import datasets.config

            held.callback(setattr, datasets.config, "HF_HUB_OFFLINE", datasets.config.HF_HUB_OFFLINE)
            datasets.config.HF_HUB_OFFLINE = True
        yield reason


def _datasets_online() -> None:
    """`datasets` online again where it was imported while this run read the cache alone."""
    config = sys.modules.get("datasets.config")
    if config is not None:
        config.HF_HUB_OFFLINE = False


def cached_file(repo_id: str, filename: str, revision: str | None = None) -> Path | None:
    """The cached copy of the repo's ``filename`` at ``revision``, as huggingface_hub falls back to it offline, or
    None when the cache has none.

    Args:
        repo_id (`str`): the Hub model.
        filename (`str`): the file in it.
        revision (`str`, *optional*): the branch, tag or commit.
    """
    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision, local_files_only=True))
    except LocalEntryNotFoundError:
        return None


def require_reachable(
    name: str,
    revision: str | None = None,
    *,
    role: str = "`model`",
    filename: str = CONFIG_FILE,
    weights: bool = False,
    token: str | bool | None = None,
) -> None:
    """Raise ``OSError`` when ``name`` is a Hub id whose ``filename`` (at ``revision``), or with ``weights`` its
    weights too (one of :data:`WEIGHT_FILES`: ``check`` and a config-only push read the config alone), are not in the
    cache and no connection to the Hub can be made (:func:`hub_unreachable`): the message says ``role`` (what
    ``name`` is to the caller), the id, the revision, the reason and what is missing. A name written as a path to
    nothing is refused (:func:`~hf_posenc.hub.errors.refuse_missing_folder`); a local folder or file, a name no repo
    can have, a cached model and a Hub that answers pass, for the loaders to read as ever.

    Args:
        name (`str`): the model, a Hub id or a local path.
        revision (`str`, *optional*): its branch, tag or commit.
        role (`str`, defaults to ``"`model`"``): what ``name`` is to the caller, for the message.
        filename (`str`, defaults to ``"config.json"``): the file that must be cached.
        weights (`bool`, defaults to `False`): its weights must be cached too.
        token (`str` or `bool`, *optional*): the token the request carries.

    Raises:
        OSError: not cached, and the Hub cannot be reached.
        FileNotFoundError: ``name`` is written as a path, and nothing is there.
    """
    refuse_missing_folder(name)
    if not _hub_repo(name):
        return
    missing = _not_cached(name, revision, filename, weights)
    if missing is None:
        return
    unreachable = hub_unreachable(name, revision, filename=filename, token=token)
    if unreachable:
        at = f" at revision {revision!r}" if revision else ""
        raise OSError(
            f"{role} {name!r}{at} cannot be loaded: the Hub cannot be reached ({unreachable}), and {missing} not in "
            "the cache."
        )


def _not_cached(name: str, revision: str | None, filename: str, weights: bool) -> str | None:
    """What of the model the cache lacks, as the message says it (``its config.json is``), or None."""
    if cached_file(name, filename, revision) is None:
        return f"its {filename} is"
    if weights and all(cached_file(name, file, revision) is None for file in WEIGHT_FILES):
        return f"its weights are ({', '.join(WEIGHT_FILES)}; only its {filename} is there)"
    return None


def _hub_repo(name: str | None) -> bool:
    """Whether ``name`` is a Hub id (not a local folder or file) that a repo can have (one that cannot is left for
    the loaders to refuse)."""
    if not is_hub_id(name):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def is_hub_id(name: str | None) -> bool:
    """``org/name`` or ``name`` that is not a local folder."""
    return bool(name) and not Path(name).exists() and name.count("/") <= 1


_REVISION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/-]*")


_LICENSE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_LICENSE_LINK = re.compile(r"https?://[A-Za-z0-9._~:/?#@!$&*+,;=%-]+")


def license_problem(key: str, value: Any) -> str | None:
    """Why ``value`` cannot be the card's ``key`` field, or None: ``license`` and ``license_name`` are identifiers
    (``apache-2.0``, ``llama3.1``: letters, digits, ``. _ + -``), ``license_link`` an http(s) URL. Nothing else
    reaches the card's metadata, which the Hub shows as a link."""
    pattern = _LICENSE_LINK if key == "license_link" else _LICENSE_ID
    if isinstance(value, str) and pattern.fullmatch(value):
        return None
    wanted = "an http(s) URL" if key == "license_link" else "a license identifier (letters, digits and . _ + - only)"
    return f"`{key}` {value!r} is not {wanted}"


def require_push_access(repo_id: str, token: str | None) -> None:
    """Raise :class:`~hf_posenc.hub.errors.HubPushError` unless the Hub endpoint answers and takes a token
    (``token``, else the saved login or ``HF_TOKEN``): what a push needs, asked (one ``whoami`` request) before a
    model loads or a weight is written."""
    action = f"Pushing to {repo_id!r}"
    effective = push_token(repo_id, token)
    if (constants.ENDPOINT, effective) not in _ACCEPTED:  # the command checks first, then push_to_hub: one request
        call_hub(lambda: HfApi(token=effective).whoami(), HubPushError, f"{action} (checking the token)", token)
        _ACCEPTED.add((constants.ENDPOINT, effective))


_ACCEPTED: set[tuple[str, str]] = set()  # (endpoint, token) pairs the Hub took in this process


def push_token(repo_id: str, token: str | None) -> str:
    """The token a push sends (``token``, else the saved login or ``HF_TOKEN``), found without a request;
    :class:`~hf_posenc.hub.errors.HubPushError` in offline mode or where there is none."""
    action = f"Pushing to {repo_id!r}"
    if is_offline_mode():
        raise HubPushError(f"{action}: HF_HUB_OFFLINE is set, and a push needs the Hub; unset it to push.")
    effective = token or get_token()
    if effective is None:
        raise HubPushError(
            f"{action} needs a Hub token, and none is given or saved: log in (hf auth login), set HF_TOKEN, or pass "
            "`token`."
        )
    return effective


def check_license(license: str | None) -> None:
    """Raise ``ValueError`` unless ``license`` is None or a license identifier (:func:`license_problem`)."""
    if license is not None and (problem := license_problem("license", license)):
        raise ValueError(f"{problem}.")


def check_card_names(base_model: str | None, base_revision: str | None, license_info: dict[str, Any]) -> None:
    """Raise ``ValueError`` unless each name a card writes as is passes the check of its kind: ``base_model`` a Hub
    repo id, ``base_revision`` a git revision (:func:`check_target`'s characters), the license fields
    (:func:`license_problem`). The card's links and code snippets hold them; nothing in them may add markdown or
    HTML.

    Args:
        base_model (`str` or `None`): the base model's Hub id.
        base_revision (`str` or `None`): the base model's revision.
        license_info (`dict[str, Any]`): ``license``, ``license_name`` and ``license_link``, those the card writes.

    Raises:
        ValueError: the first name that fails its check.
    """
    if base_model is not None:
        _check_repo_id("base_model", base_model)
    if base_revision is not None and not _REVISION.fullmatch(base_revision):
        raise ValueError(f"`base_revision` {base_revision!r} is not a revision: letters, digits and . _ / - only.")
    problems = [problem for key, value in license_info.items() if (problem := license_problem(key, value))]
    if problems:
        raise ValueError(f"{problems[0]}.")


def _check_repo_id(name: str, repo_id: str) -> None:
    """Raise ``ValueError`` naming the argument ``name`` unless huggingface_hub takes ``repo_id`` as a repo id."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise ValueError(f"`{name}` {repo_id!r} is not a Hub repo id: {error}") from None


def check_target(repo_id: str, revision: str | None = None, license: str | None = None) -> None:
    """Raise ``ValueError`` unless ``repo_id`` passes huggingface_hub's own check of a repo id, ``revision`` is a
    branch name git and the Hub accept (letters, digits, ``. _ / -``; no ``..``, ``//``, or a trailing ``/``, ``.``
    or ``.lock``) and ``license`` a license identifier: what a push writes to, and what its card names, before
    anything is loaded or written.

    Args:
        repo_id (`str`): the repo pushed to.
        revision (`str`, *optional*): the branch pushed to.
        license (`str`, *optional*): the card's license.

    Raises:
        ValueError: ``repo_id``, ``revision`` or ``license`` fails its check.
    """
    _check_repo_id("repo", repo_id)
    check_license(license)
    if revision is None:
        return
    bad = (
        not _REVISION.fullmatch(revision)
        or ".." in revision
        or "//" in revision
        or revision.endswith(("/", ".", ".lock"))
    )
    if bad:
        raise ValueError(
            f"`revision` {revision!r} is not a branch name the Hub takes: letters, digits and . _ / - only, without "
            "'..', '//' or a trailing '/', '.' or '.lock'."
        )
