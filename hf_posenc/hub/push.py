"""Push patched models to the Hugging Face Hub and load them back.

By default a push is *config-only*: the repo gets the patched ``config.json``, a generated model card
and ``hf_posenc.json``, a small record naming the base model and the exact commit its weights come
from; :func:`from_pretrained` downloads those base weights and applies the config. With
``with_weights=True`` the repo holds the full model (safetensors) instead. Everything is written to a
local temporary folder first and sent in one commit, so a failed push changes nothing locally and
leaves no partial commit on the Hub (the repo itself may have been created, empty; a branch created for the commit
is deleted again, :mod:`hf_posenc.hub.commit`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import CommitInfo, HfApi, ModelCard
from huggingface_hub.errors import RevisionNotFoundError
from transformers import AutoConfig, PreTrainedModel

from .._version import __version__
from ..files import json_text
from ..patching import added_tensors, trained_tensors
from ..patching.loading import load_patched_model
from ..patching.wrappers import adapter_layers, unwrapped
from ..plots.encoding_figures import patch_plot_file, write_patch_plot
from ..plots.figures import plot_ppl_vs_length
from ..record import PatchRecord
from ..reports.schema import report_for_file
from .card import PLOT_FILE, EvalTable, LmEvalTable, load_eval_table, load_lm_eval_table, public_results, render_card
from .commit import LM_EVAL_FILE, RESULTS_FILE, commit_folder
from .errors import HubError, HubPushError, call_hub
from .metadata import METADATA_FILE, METADATA_FORMAT, read_metadata
from .provenance import Pushed, check_measured_on, weights_commit
from .reach import check_target, is_hub_id, license_problem, push_token, require_push_access

_LICENSE_FIELDS = ("license", "license_name", "license_link")
_HUB_KWARGS = ("revision", "token", "cache_dir", "local_files_only")
logger = logging.getLogger("hf_posenc")


@dataclass(frozen=True)
class BaseRef:
    """The Hub repo and commit the patched model's weights come from (None: not known)."""

    repo_id: str
    revision: str | None
    license_info: dict[str, str]


def push_to_hub(
    model: PreTrainedModel,
    repo_id: str,
    *,
    eval_results: str | Path | None = None,
    lm_eval_results: str | Path | None = None,
    with_weights: bool = False,
    encoding_plot: bool = True,
    tokenizer: Any = None,
    base_model: str | None = None,
    base_revision: str | None = None,
    license: str | None = None,
    private: bool | None = None,
    exist_ok: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    token: str | None = None,
    weights_fingerprint: str | None = None,
) -> CommitInfo:
    """Push a patched model to ``repo_id`` in one commit: config, model card, metadata (and weights).

    Args:
        model (`PreTrainedModel`): a model patched with ``hf_posenc.patch``; it is not modified.
        repo_id (`str`): target repo, ``"user/name"``.
        eval_results (`str` or `Path`, *optional*): an eval ``results.json``; its rows for this method and
            for ``none`` go into the card and its ``model-index``, with ``ppl_vs_length.png`` when present.
        lm_eval_results (`str` or `Path`, *optional*): an ``hf-posenc lm-eval`` ``lm_eval.json``; the task scores
            of this method and of ``none`` go into the card.
        with_weights (`bool`, *optional*, defaults to `False`): push the full model (safetensors)
            instead of a config-only repo that loads its weights from the base model.
        encoding_plot (`bool`, *optional*, defaults to `True`): for a RoPE scaling (alone or in a combination),
            push ``frequencies.png``, what it does to each rotary pair (:mod:`hf_posenc.plots.encoding_figures`),
            shown in the card; other methods get none.
        tokenizer (*optional*): saved into the repo too when given.
        base_model (`str`, *optional*): Hub id of the base model; defaults to ``model.name_or_path``.
            A config-only push needs one.
        base_revision (`str`, *optional*): branch, tag or commit of the base model the weights come from;
            defaults to ``"main"``. A config-only push records the commit it resolves to now; a push with weights
            the commit they were loaded at (:func:`~hf_posenc.hub.provenance.weights_commit`: a commit given, or the
            cache's, if its weights are the model's), or none where that cannot be told.
        license (`str`, *optional*): license for the card; defaults to the base model's.
        private (`bool`, *optional*): create the repo private.
        exist_ok (`bool`, *optional*, defaults to `False`): push to a repo that already exists.
        revision (`str`, *optional*): branch to commit to (created from ``main`` if missing, and deleted again if the
            commit fails); the card's snippets load that branch.
        commit_message (`str`, *optional*): defaults to ``"Add <method> patch of <base> (hf_posenc)"``.
        token (`str`, *optional*): Hub token; defaults to the saved login (``hf auth login``, ``HF_TOKEN``).
        weights_fingerprint (`str`, *optional*): with ``with_weights``, the fingerprint of the model before the patch
            (:func:`hf_posenc.hub.fingerprint.model_fingerprint`, as ``hf-posenc push`` takes it); eval results that
            record one in the model's dtype must have it, whatever the commit they name.

    Returns:
        [`~huggingface_hub.CommitInfo`] of the commit.

    Raises:
        ValueError: the model is not patched, the eval results do not fit (other parameters; another model,
            commit of the base or weights), or a config-only push cannot tell which Hub repo holds the base weights.
        HubPushError: the Hub refused or failed (auth, repo exists without ``exist_ok``, server error), also
            when reading the base model's commit and license.
    """
    check_target(repo_id, revision, license)
    push_token(repo_id, token)  # offline mode, or no token: before the base model is read
    api = HfApi(token=token)
    errors = (HubPushError, f"Pushing to {repo_id!r}")
    results = (eval_results, lm_eval_results)
    weights = (with_weights, weights_fingerprint if with_weights else None)
    contents = _push_contents(
        model, api, results, weights, base_model, base_revision, license, token, errors, encoding_plot
    )
    require_push_access(repo_id, token)  # before a weight is written

    def commit() -> CommitInfo:
        with tempfile.TemporaryDirectory(prefix="hf_posenc_push_") as folder:
            stage_repo(model, Path(folder), repo_id=repo_id, revision=revision, contents=contents, tokenizer=tokenizer)
            api.create_repo(repo_id, private=private, exist_ok=exist_ok)
            if private and not api.repo_info(repo_id).private:
                raise HubPushError(
                    f"Pushing to {repo_id!r} refused: the repo exists and is public, and `private` does not change "
                    "an existing repo's visibility. Make it private on the Hub first, or push without it."
                )
            message = commit_message or f"Add {contents.record.spec} patch of {contents.base_id} (hf_posenc)"
            return commit_folder(api, repo_id, Path(folder), revision=revision, message=message, token=token)

    return call_hub(commit, *errors, token)


def build_card(
    model: PreTrainedModel,
    repo_id: str,
    *,
    eval_results: str | Path | None = None,
    lm_eval_results: str | Path | None = None,
    with_weights: bool = False,
    encoding_plot: bool = True,
    base_model: str | None = None,
    base_revision: str | None = None,
    license: str | None = None,
    token: str | None = None,
    revision: str | None = None,
    weights_fingerprint: str | None = None,
) -> ModelCard:
    """The model card :func:`push_to_hub` would push with the same arguments, rendered without pushing.

    Reads the base model's commit and license from the Hub when the base model is a Hub id.

    Args:
        model (`PreTrainedModel`): a model patched with ``hf_posenc.patch``; it is not modified.
        repo_id (`str`): the repo the card is for, ``"user/name"``.
        eval_results (`str` or `Path`, *optional*): an eval ``results.json``, as :func:`push_to_hub` takes it.
        lm_eval_results (`str` or `Path`, *optional*): an ``hf-posenc lm-eval`` ``lm_eval.json``.
        with_weights (`bool`, *optional*, defaults to `False`): the card of a push with the full model.
        encoding_plot (`bool`, *optional*, defaults to `True`): show ``frequencies.png`` for a RoPE scaling.
        base_model (`str`, *optional*): Hub id of the base model; defaults to ``model.name_or_path``.
        base_revision (`str`, *optional*): branch, tag or commit of the base model the weights come from.
        license (`str`, *optional*): license for the card; defaults to the base model's.
        token (`str`, *optional*): Hub token for the requests.
        revision (`str`, *optional*): the branch pushed to; the card's snippets load it.
        weights_fingerprint (`str`, *optional*): with ``with_weights``, the model's fingerprint before the patch,
            compared with the results' as a push compares it.

    Raises:
        ValueError: as :func:`push_to_hub` refuses the same arguments (a target, a license, a model or eval results).
        HubError: the Hub refused or failed reading the base model's commit and license.
    """
    check_target(repo_id, revision, license)
    api = HfApi(token=token)
    errors = (HubError, f"Rendering the card of {repo_id!r}")
    results = (eval_results, lm_eval_results)
    weights = (with_weights, weights_fingerprint if with_weights else None)
    contents = _push_contents(
        model, api, results, weights, base_model, base_revision, license, token, errors, encoding_plot
    )
    return _render(model, repo_id, revision, contents)


@dataclass(frozen=True)
class _PushContents:
    record: PatchRecord
    eval_table: EvalTable | None
    lm_eval_table: LmEvalTable | None
    base_id: str
    base: BaseRef | None
    with_weights: bool
    license_info: dict[str, str]
    encoding_plot: str | None  # the file name of the encoding plot pushed, if any


def _push_contents(
    model: PreTrainedModel,
    api: HfApi,
    results: tuple[str | Path | None, str | Path | None],  # eval results.json, lm_eval.json
    weights: tuple[bool, str | None],  # with_weights, and their fingerprint before the patch if known
    base_model: str | None,
    base_revision: str | None,
    license: str | None,
    token: str | None,
    errors: tuple[type[HubError], str],
    encoding_plot: bool,
) -> _PushContents:
    """Check the model and eval results (:func:`~hf_posenc.hub.provenance.check_measured_on`: measured on the weights
    pushed), resolve the base model's commit and license, and name the encoding plot
    (:func:`~hf_posenc.plots.encoding_figures.patch_plot_file`) when asked for one."""
    if unwrapped(model) is not model:  # its save_pretrained would write a peft wrapper's adapters alone
        raise ValueError(
            f"{type(model).__name__} wraps the model to push; pass the model it wraps (a peft model: "
            "`merge_and_unload()` first, so that its adapters' weights are in it)."
        )
    adapted = adapter_layers(model)
    if adapted:  # saved, its weights would be named base_layer and lora_A / lora_B: the model's own missing
        raise ValueError(
            f"`model` holds peft adapter layers ({adapted[0]}, ... {len(adapted)} in all), whose weights load into "
            "no layer of the pushed model; merge them into the weights first (a PeftModel's `merge_and_unload()`)."
        )
    record = PatchRecord.from_config(model.config)
    eval_table = load_eval_table(results[0], record) if results[0] is not None else None
    lm_eval_table = load_lm_eval_table(results[1], record) if results[1] is not None else None
    base_id = base_model or model.name_or_path
    with_weights, fingerprint = weights
    if not with_weights and (record.baked or (trained := trained_tensors(model))):
        changed = (  # GPT-2 pi; a trained T5 table
            f"this model's weights (GPT-2's position table, resampled to {model.config.n_positions} rows)"
            if record.baked
            else f"{', '.join(trained)}, which it added, since the patch (trained)"
        )
        hint = "a config-only repo would not give that back. Push the weights too (`with_weights`)."
        raise ValueError(f"{record.spec!r} changed {changed}: {hint}")
    if not with_weights and not is_hub_id(base_id):
        raise ValueError(
            f"A config-only repo (what push writes, and card describes, unless the weights go too) needs the Hub id of "
            f"the base model its weights load from, and {base_id!r} is not one (a local folder?); pass it as "
            "`base_model` ('org/name': the repo the weights come from), or include the weights (`with_weights`)."
        )
    base = None
    if is_hub_id(base_id):
        error_type, action = errors
        reading = f"{action} (reading the base model {base_id!r})"
        base = call_hub(lambda: _resolve_base(api, base_id, base_revision), error_type, reading, token)
    if base is not None and with_weights:  # the weights in memory: the commit they were loaded at, not main's now
        base = dataclasses.replace(base, revision=weights_commit(model, base_id, base_revision))
        if base.revision is None:
            logger.warning(
                "The commit of %r the weights pushed come from cannot be told (transformers keeps none; not the "
                "weights the cache holds for %r): none is recorded. Give the commit loaded as `base_revision`.",
                base_id, base_revision or "main",
            )  # fmt: skip
    dtype = str(model.dtype).removeprefix("torch.")
    pushed = Pushed(base_id, base.revision if base else None, base_revision, fingerprint, dtype)
    _check_results(api, (eval_table, lm_eval_table), pushed, errors, token)
    license_info = {"license": license} if license else (base.license_info if base else {})
    plot = patch_plot_file(record) if encoding_plot else None
    return _PushContents(record, eval_table, lm_eval_table, base_id, base, with_weights, license_info, plot)


def stage_repo(
    model: PreTrainedModel,
    folder: Path,
    *,
    repo_id: str,
    revision: str | None,
    contents: _PushContents,
    tokenizer: Any = None,
) -> None:
    """Write every file of the repo into ``folder``: config (and weights), card (of the branch ``revision``),
    metadata, eval results (and their plot), lm-eval results and the encoding plot, as ``contents`` holds them.

    Args:
        model (`PreTrainedModel`): the patched model; its config is as it was after.
        folder (`Path`): the folder to write into (a push's temporary one).
        repo_id (`str`): the repo pushed to, named in the card and the plot's title.
        revision (`str` or `None`): the branch pushed to, which the card's snippets load.
        contents (`_PushContents`): what :func:`push_to_hub` checked and resolved before (``_push_contents``).
        tokenizer (*optional*): saved into ``folder`` too when given.
    """
    if contents.with_weights:
        with _config_restored(model):
            model.save_pretrained(folder)
    else:
        config = copy.deepcopy(model.config)
        config.architectures = [type(model).__name__]
        config.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    metadata = {
        "format": METADATA_FORMAT,
        "weights": contents.with_weights,
        "base_model": contents.base.repo_id if contents.base else None,
        "base_revision": contents.base.revision if contents.base else None,
        "hf_posenc_version": __version__,
    }
    (folder / METADATA_FILE).write_text(json_text(metadata), encoding="utf-8")
    if contents.eval_table is not None:
        table = contents.eval_table
        results = {**public_results(report_for_file(table.report)), "dataset": table.dataset}
        (folder / RESULTS_FILE).write_text(json_text(results), encoding="utf-8")
        trained = (
            contents.record.params.get("original_max_position_embeddings")
            or contents.record.base_max_position_embeddings
        )
        title = f"{repo_id}: perplexity on {table.dataset}\nprotocol {table.protocol}"
        plot_ppl_vs_length(folder / PLOT_FILE, table.results, trained_context=trained, title=title)
    if contents.lm_eval_table is not None:  # as load_lm_eval_table read and checked it; local paths cut
        scores = public_results(contents.lm_eval_table.report)
        (folder / LM_EVAL_FILE).write_text(json_text(scores), encoding="utf-8")
    if contents.encoding_plot is not None:
        write_patch_plot(folder / contents.encoding_plot, model.config)
    _render(model, repo_id, revision, contents).save(folder / "README.md")


def _render(model: PreTrainedModel, repo_id: str, revision: str | None, contents: _PushContents) -> ModelCard:
    return render_card(
        model.config,
        repo_id=repo_id,
        revision=revision,
        base_model=contents.base.repo_id if contents.base else None,
        base_revision=contents.base.revision if contents.base else None,
        config_only=not contents.with_weights,
        added_tensors=contents.with_weights and bool(added_tensors(model)),
        license_info=contents.license_info,
        eval_table=contents.eval_table,
        encoding_plot=contents.encoding_plot,
        lm_eval_table=contents.lm_eval_table,
    )


def from_pretrained(pretrained_model_name_or_path: str, **kwargs: Any) -> PreTrainedModel:
    """Load a model pushed by :func:`push_to_hub` (or saved after ``hf_posenc.patch``), patched and ready.

    A config-only repo (its ``hf_posenc.json`` says ``"weights": false``) loads the base model's weights
    from the repo and commit it names (its GGUF file, where it names one), with the pushed config; anything else
    loads like ``hf_posenc.patching.load_patched_model``.

    Args:
        pretrained_model_name_or_path (`str`): Hub id or local folder.
        **kwargs: ``revision`` (of this repo), ``token``, ``cache_dir`` and anything
            ``AutoModelForCausalLM.from_pretrained`` takes (``dtype``, ``device_map``, ...).

    Raises:
        HubError: the Hub refused or failed a request (for this repo or the base model's weights).
    """
    name = pretrained_model_name_or_path
    hub_kwargs = {key: kwargs[key] for key in _HUB_KWARGS if key in kwargs}
    metadata = read_metadata(name, **hub_kwargs)

    def load() -> PreTrainedModel:
        if metadata is None or metadata["weights"]:
            return load_patched_model(name, **kwargs)
        config = AutoConfig.from_pretrained(name, **hub_kwargs)
        base = {"revision": metadata["base_revision"], "config": config}  # this repo's revision is not the base's
        if metadata.get("base_gguf_file"):
            base["gguf_file"] = metadata["base_gguf_file"]
        return load_patched_model(metadata["base_model"], **{**kwargs, **base})

    return call_hub(load, HubError, f"Loading {name!r}", kwargs.get("token"))


def _resolve_base(api: HfApi, repo_id: str, revision: str | None) -> BaseRef:
    """The base model's commit for ``revision`` and the license fields of its card."""
    info = api.model_info(repo_id, revision=revision)
    card = info.card_data.to_dict() if info.card_data else {}
    license_info = {key: card[key] for key in _LICENSE_FIELDS if card.get(key)}
    link = license_info.get("license_link")
    if isinstance(link, str) and "://" not in link:  # a file of the base repo (LICENSE): the new repo does not have it
        license_info["license_link"] = f"{api.endpoint}/{repo_id}/blob/{info.sha}/{link.removeprefix('./')}"
    for key, value in list(license_info.items()):
        if problem := license_problem(key, value):
            logger.warning("The card leaves out the base model's license field: %s.", problem)
            del license_info[key]
    return BaseRef(repo_id=repo_id, revision=info.sha, license_info=license_info)


def _check_results(
    api: HfApi,
    tables: tuple[EvalTable | LmEvalTable | None, ...],
    pushed: Pushed,
    errors: tuple[type[HubError], str],
    token: str | None,
) -> None:
    """Each of ``tables`` measured on the weights ``pushed`` (:func:`~hf_posenc.hub.provenance.check_measured_on`), a
    branch or tag of the base that one names read on the Hub."""
    error_type, action = errors
    reading = f"{action} (reading the base model {pushed.model!r})"

    def commit_of(revision: str) -> str | None:
        return call_hub(lambda: _commit_of(api, pushed.model, revision), error_type, reading, token)

    for table in tables:
        if table is not None:
            check_measured_on(table.model, table.source, table.measured, pushed, commit_of)


def _commit_of(api: HfApi, repo_id: str, revision: str) -> str | None:
    """The commit ``revision`` (a branch or tag) of ``repo_id`` points at now; None when the Hub has no such one."""
    try:
        return api.model_info(repo_id, revision=revision).sha
    except RevisionNotFoundError:
        return None


@contextlib.contextmanager
def _config_restored(model: PreTrainedModel) -> Iterator[None]:
    """``save_pretrained`` assigns ``config.architectures`` and ``dtype``; put the old values back after."""
    before = dict(model.config.__dict__)
    try:
        yield
    finally:
        model.config.__dict__.clear()
        model.config.__dict__.update(before)
