"""Whether results were measured on the weights a push pushes, or names: the same model, the same commit of it, and
where both sides know them, the same weights.

A results file records the model it loaded (``model``; ``model_details``: ``name``, or ``weights_from`` for a
config- only repo), the revision asked for (``model_details.revision``: a branch, tag or commit; none recorded: the
default branch, ``main``), the commit of a Hub model as loaded (``model_details.commit``; null: not a Hub model, or
a model object passed in Python whose config names no commit) and, for ``hf-posenc eval``, a fingerprint of the
weights as loaded (:func:`hf_posenc.hub.fingerprint.model_fingerprint`) in the dtype it records. A config-only push
knows the commit its base resolves to now, which its repo loads; a push of weights the commit they were loaded at,
where that can be told (:func:`weights_commit`), else none: results are then let through with a warning. A recorded
commit is compared with it. A file that records only a branch or tag is read as the commit that name points at now:
refused when that is not the commit pushed, let through with a warning when it is (whether the name pointed there
when measured cannot be told). A revision the Hub no longer has, or none known, cannot be compared, and is let
through with a warning. Where a push of the weights knows their fingerprint in the dtype of the results, the
fingerprints are compared instead: the same weights are the same model, whatever the commit.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import try_to_load_from_cache
from safetensors import safe_open

from ..patching.wrappers import offloaded_values
from .reach import is_hub_id

logger = logging.getLogger("hf_posenc")
FULL_COMMIT = re.compile(r"[0-9a-fA-F]{40}")


@dataclass(frozen=True)
class Measured:
    """What a results file says of the weights it was measured on."""

    model: str = ""  # where the weights came from, as a push compares it with its base: a local one's path
    revision: str | None = None  # the branch, tag or commit of ``model`` asked ("main": none given); None: not known
    commit: str | None = None  # the commit of ``model`` loaded (recorded since hf-posenc records it)
    fingerprint: str | None = None  # of the weights as loaded, in ``dtype``
    dtype: str | None = None


@dataclass(frozen=True)
class Pushed:
    """What a push says of the weights it pushes or names."""

    model: str  # the base model: a Hub id or a folder
    commit: str | None  # the base's commit the weights come from (None: not a Hub id, or not known)
    revision: str | None  # what that commit was asked as (None: ``main``)
    fingerprint: str | None = None  # of the weights pushed before the patch, in ``dtype`` (a push with its weights)
    dtype: str | None = None


def measured_of(report: dict[str, Any]) -> Measured:
    """What ``report`` (an eval ``results.json`` or an ``lm_eval.json``) says of the weights it was measured on."""
    details = report.get("model_details") if isinstance(report.get("model_details"), dict) else {}
    weights_from, fingerprint, commit = details.get("weights_from"), details.get("fingerprint"), details.get("commit")
    return Measured(
        model=str(weights_from or details.get("name") or report["model"]),
        revision=_revision_asked(details),
        commit=commit.lower() if isinstance(commit, str) and FULL_COMMIT.fullmatch(commit) else None,
        fingerprint=fingerprint if isinstance(fingerprint, str) else None,
        dtype=str(details["dtype"]) if details.get("dtype") else None,
    )


def _revision_asked(details: dict[str, Any]) -> str | None:
    """The revision ``details`` name as asked (none recorded: ``main``); None where it is not known: no details, a
    saved config-only repo's (``weights_from``: that repo's revision, not the base's), or an explicit null (a model
    object's)."""
    if not details or details.get("weights_from") or ("revision" in details and details["revision"] is None):
        return None
    return str(details.get("revision") or "main")


def check_measured_on(
    name: str, source: Path, measured: Measured, pushed: Pushed, commit_of: Callable[[str], str | None]
) -> None:
    """Raise ``ValueError`` when the results ``source`` (measured on ``name``, as a card says it) are known to come
    from other weights than ``pushed``: another model, other weights by fingerprint, or another commit.

    Args:
        commit_of (`Callable`): the commit a branch or tag of the base points at now; None when the Hub has none.
    """
    if different_models(measured.model, pushed.model):
        raise ValueError(
            f"The results {source} were measured on {name!r}, not on the base model {pushed.model!r}. "
            f"Evaluate {pushed.model!r}, or leave the results out."
        )
    comparable = pushed.fingerprint and measured.fingerprint and pushed.dtype == measured.dtype
    if comparable and pushed.fingerprint != measured.fingerprint:
        raise ValueError(
            f"The results {source} were measured on other weights than those pushed: their fingerprint is "
            f"{measured.fingerprint} there, {pushed.fingerprint} here (both {pushed.dtype}; another commit, or weights "
            "retrained or replaced under the same name). Evaluate the weights pushed, or leave the results out."
        )
    if comparable or not is_hub_id(measured.model) or not is_hub_id(pushed.model):
        return
    if not pushed.commit:
        logger.warning(
            "The commit of %r whose weights are pushed is not known (see `base_revision`): whether the results %s "
            "were measured on them cannot be told. Give the commit loaded as `base_revision`, or the weights' "
            "fingerprint (`weights_fingerprint`).",
            pushed.model, source,
        )  # fmt: skip
    elif measured.commit or measured.revision:
        _check_commit(source, measured.commit or measured.revision, pushed, commit_of)
    else:
        logger.warning(
            "The results %s record no revision of %r (a model object passed in Python, or a saved config-only "
            "repo): whether they were measured on the commit pushed, %s, cannot be told.",
            source, pushed.model, pushed.commit,
        )  # fmt: skip


def _check_commit(source: Path, revision: str, pushed: Pushed, commit_of: Callable[[str], str | None]) -> None:
    """Raise ``ValueError`` when ``revision`` of the base, as recorded in ``source`` (the commit loaded; in an older
    file, the branch or tag asked, read as the commit it points at now), is not the commit pushed."""
    asked = pushed.revision or "main"
    named = not FULL_COMMIT.fullmatch(revision)
    commit = commit_of(revision) if named else revision.lower()
    if commit is None:
        logger.warning(
            "The results %s were measured on revision %r of %r, which the Hub does not have (any more): whether it "
            "is the commit pushed, %s, cannot be told.",
            source, revision, pushed.model, pushed.commit,
        )  # fmt: skip
        return
    if commit != pushed.commit:
        measured = revision if commit == revision.lower() else f"{revision!r} (now commit {commit})"
        raise ValueError(
            f"The results {source} were measured on revision {measured} of {pushed.model!r}, and the weights pushed "
            f"come from its commit {pushed.commit} ({asked!r}). Evaluate that commit, push the revision measured "
            f"(`base_revision` {revision!r}), or leave the results out."
        )
    if named:
        logger.warning(
            "The results %s record the revision %r of %r they were measured on, not its commit (an older file): it "
            "is the commit pushed, %s, now; whether it was when they were measured cannot be told. Evaluate again "
            "to record the commit.",
            source, revision, pushed.model, pushed.commit,
        )  # fmt: skip


def weights_commit(model: torch.nn.Module, repo_id: str, revision: str | None) -> str | None:
    """The commit of ``repo_id`` whose weights ``model`` holds, for a push of them: ``revision`` where it is a commit
    (the caller's word), else the commit the cache's ``revision`` (None: ``main``) pointed at when last resolved (by
    the model's load, where it came from this cache), if the first row of each of its safetensors weights that the
    model holds in that shape is the model's (weights the patch changed or added differ in shape, or are not there;
    weights a ``device_map`` offloaded are read from accelerate's hooks). None where that cannot be told
    (transformers keeps no commit of a model loaded): not in the default cache, no weights there to compare, or
    other weights (another commit loaded, or the cache resolved the branch again)."""
    if revision and FULL_COMMIT.fullmatch(revision):
        return revision.lower()
    config = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    if not isinstance(config, str) or not FULL_COMMIT.fullmatch(Path(config).parent.name):
        return None
    held = {name: tensor for name, tensor in model.state_dict().items() if tensor.dim()}
    compared = 0
    for file in sorted(Path(config).parent.glob("*.safetensors")):
        with safe_open(file, framework="pt") as weights:
            for stored_name, name in sorted(_held_names(weights.keys(), held, model).items()):
                tensor, stored = held[name], weights.get_slice(stored_name)
                if not tensor.numel() or tuple(tensor.shape) != tuple(stored.get_shape()):
                    continue
                tensor = offloaded_values(model, name) if tensor.is_meta else tensor
                if not torch.equal(stored[:1].to(tensor.dtype), tensor[:1].cpu()):
                    return None
                compared += 1
    return Path(config).parent.name.lower() if compared else None


def _held_names(stored: Any, held: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, str]:
    """Each name of a checkpoint file that ``model`` holds, and its name in the model: as stored, or with the
    model's ``base_model_prefix`` (a base model's checkpoint, GPT-2's ``wte.weight`` for ``transformer.wte.weight``)."""
    prefix = getattr(model, "base_model_prefix", "")
    names = {}
    for name in stored:
        for candidate in (name, f"{prefix}.{name}"):  # no prefix: ".name", which no model holds
            if candidate in held:
                names[name] = candidate
                break
    return names


def different_models(measured: str, base: str) -> bool:
    """Whether results measured on ``measured`` are known to come from another model than ``base``: two Hub
    ids that differ, or two local folders that are not the same folder. A Hub id against a local folder
    (a downloaded copy?) or a folder no longer there cannot be told apart, and is let through."""
    if is_hub_id(measured) and is_hub_id(base):
        return measured != base
    if Path(measured).is_dir() and Path(base).is_dir():
        return not Path(measured).samefile(base)
    return False
