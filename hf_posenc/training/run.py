"""Continued pretraining of a patched model with transformers' ``Trainer``.

A method that replaces the position encoding (``alibi``, ``nope``, ``t5-bias``; ``pi`` on a RoPE model) leaves
the model to relearn what its weights expected; a short continued pretraining on packed text windows
(:mod:`hf_posenc.training.packing`) does that. The ``Trainer`` brings accelerate (multi-GPU, DeepSpeed, FSDP),
activation checkpointing and checkpoint resume.

``output_dir`` receives ``train_run.json`` (what identifies the run, written first), the Trainer's checkpoints
``checkpoint-N``, and at the end the patched model, its tokenizer and ``train_summary.json``: the config carries
the hf_posenc record, so ``hf_posenc.from_pretrained(output_dir)`` rebuilds the patched model.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import accelerate
import torch
import transformers
from accelerate import PartialState
from transformers import PreTrainedModel, TrainerCallback, TrainingArguments, default_data_collator
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .._version import __version__
from ..files import atomic_write_text, json_text
from ..patching import get_patch, learned_table_rows, unpatch
from ..reports.train_summary import SUMMARY_FILE, TrainData, TrainSummary
from ..spec import MethodSpec
from .checkpoints import (
    RUN_FILE,
    check_checkpoint_files,
    check_output,
    last_checkpoint,
    readable_by_the_trainer,
    run_identity,
    run_lock,
)
from .lora import add_adapters, check_rank, merge_adapters, remove_adapters
from .optimizer import PositionRateTrainer
from .packing import PackedWindows, pack_texts
from .settings import TrainSettings
from .trainable import apply_method, release_gguf, select_trainable, unused_parameters
from .trainer_arguments import training_arguments

logger = logging.getLogger(__name__)

CLOCK_FILE = "hf_posenc_seconds.json"  # in each checkpoint: the training time of the run up to it


@dataclass(frozen=True)
class TrainResult:
    """What a :func:`train` call did.

    Attributes:
        final_loss (`float`): the last logged training loss (NaN if none was logged).
        losses (`list[tuple[int, float]]`): ``(step, loss)`` of every step of the run, earlier sessions' included.
        steps (`int`): optimizer steps the model has taken in this run, all sessions.
        seconds (`float`): time spent in ``Trainer.train``, all sessions: the earlier ones' up to the checkpoint
            this call resumed from (the steps a killed session took after it are taken again, and counted once),
            plus this call's.
        trainable_parameters (`int`): values that train.
    """

    final_loss: float
    losses: list[tuple[int, float]]
    steps: int
    seconds: float
    trainable_parameters: int


def train(
    model: PreTrainedModel,
    tokenizer: Any,
    texts: Sequence[str] | PackedWindows,
    output_dir: str | Path,
    settings: TrainSettings,
    method: str | MethodSpec,
    *,
    callbacks: list[TrainerCallback] | None = None,
    sources: dict[str, Any] | None = None,
) -> TrainResult:
    """Patch ``model`` with ``method`` and train it on ``texts``; save the patched model to ``output_dir``.

    Args:
        model (`PreTrainedModel`): the unpatched base model (the patch is applied here, so that
            ``trainable="position"`` knows what it added). A model loaded from a GGUF file is made an ordinary
            one first (:func:`release_gguf`). It is left patched, trained, in eval mode. Where the run stops before
            the ``Trainer`` runs (a check refuses it, the run's record cannot be written) it is handed back as it
            came; where the ``Trainer`` fails (loading a checkpoint, a step), patched, with the weights it has then.
        tokenizer: its tokenizer; saved with the model.
        texts (`Sequence[str]` or `PackedWindows`): the documents, or windows packed already (:func:`pack_texts`).
        output_dir (`str` or `Path`): an empty or new folder, or with ``settings.resume`` one holding this run.
        settings (`TrainSettings`): how to train.
        method (`str` or `MethodSpec`): the method spec, e.g. ``"alibi"``, ``"t5-bias:num_buckets=32"``.
        callbacks (`list[TrainerCallback]`, *optional*): passed to the ``Trainer``.
        sources (`dict`, *optional*): where the model and texts came from, recorded in ``train_summary.json``.

    Raises:
        ValueError: bad settings or method, too little text for one window, ``output_dir`` holding other files or
            (without ``resume``) a run, or a run of other arguments; raised before anything is written.
    """
    spec = method if isinstance(method, MethodSpec) else MethodSpec.parse(method)
    output_dir = Path(output_dir)
    data = texts if isinstance(texts, PackedWindows) else pack_texts(tokenizer, texts, settings.length)
    _check_settings(model, data, settings)
    args = training_arguments(model, output_dir, settings)  # its processes: the run's (accelerate launch's)
    identity = run_identity(model, spec, settings, data, args.world_size)
    check_output(output_dir, identity, settings.resume)
    if settings.resume and not (output_dir / RUN_FILE).is_file():
        logger.warning("`resume`: %s holds no run yet; starting one.", output_dir)
    release_gguf(model)
    handed_in = _HandedIn.of(model)
    if args.place_model_on_device:  # patched where and as it trains: the backend "auto" picks depends on both
        model.to(args.device)
    model.train()
    added = apply_method(model, spec)
    # the first process's lock on the output until the run returns or fails; the resumed checkpoint's config put back
    with contextlib.ExitStack() as held:
        try:
            session = _session(model, tokenizer, data, spec, settings, args, added, identity, held, callbacks)
        except BaseException:  # a refused check, or a failure before the Trainer runs: the model as it was handed in
            if not spec.unpatched:
                unpatch(model)
            handed_in.restore(model)
            raise
        result = _train_and_save(model, session, settings, handed_in, output_dir)
        if args.should_save:
            summary = _summary(model, spec, settings, data, result, args, sources)
            _write_json(output_dir / SUMMARY_FILE, summary.to_json())
        return result


def _check_settings(model: PreTrainedModel, data: PackedWindows, settings: TrainSettings) -> None:
    """Refuse settings that cannot mean what they say for this model and data; warn of a warmup that never ends."""
    if data.length != settings.length:
        raise ValueError(f"`texts` are packed in windows of {data.length} tokens, not `length` {settings.length}.")
    if settings.bf16 and model.dtype != torch.float32:
        raise ValueError(f"`bf16` autocast trains float32 weights; the model is in {model.dtype}: load it in float32.")
    if settings.batch_size > len(data):
        raise ValueError(
            f"`batch_size` {settings.batch_size} is more windows than the texts make ({len(data)} of {data.length} "
            "tokens): every step would see the same windows. Lower it, or give more text."
        )
    if settings.trainable == "lora":
        check_rank(model, settings.resolved_lora_rank)
    if settings.warmup_steps >= settings.steps:  # allowed (a run started so resumes), but hardly what was meant
        logger.warning(
            "warmup_steps %d is not below steps %d: the learning rate does not reach learning_rate %g in this run.",
            settings.warmup_steps,
            settings.steps,
            settings.learning_rate,
        )


def _note_position_parameters(model: PreTrainedModel, spec: MethodSpec, trainable: str, added: frozenset[str]) -> None:
    """``trainable`` 'position' trains the position parameters as patched and the norms: with a method that adds
    none to this model (ALiBi, NoPE, a RoPE scaling), the norms alone, which is said once."""
    if trainable == "position" and not added:
        logger.warning(
            "%s adds no position parameters to %s: `trainable` 'position' trains its normalisation weights only.",
            spec.text,
            type(model).__name__,
        )


@dataclass
class _Session:
    """A Trainer ready to run: the checkpoint it resumes from, its clock and the count of values that train."""

    trainer: PositionRateTrainer
    checkpoint: str | None
    clock: _Clock
    trainable: int


def _session(
    model: PreTrainedModel,
    tokenizer: Any,
    data: PackedWindows,
    spec: MethodSpec,
    settings: TrainSettings,
    args: TrainingArguments,
    added: frozenset[str],
    identity: dict[str, Any],
    held: contextlib.ExitStack,
    callbacks: list[TrainerCallback] | None,
) -> _Session:
    """Check the patched model, add LoRA adapters where asked (removed again if this fails), write the run's record
    under its lock (``held``) and build the Trainer, resuming the run's last checkpoint where asked."""
    adapting = False  # whether LoRA adapters may be in the model
    try:
        _check_patched(model, spec, settings, args.device, added)
        _note_position_parameters(model, spec, settings.trainable, added)
        if settings.trainable == "lora":  # the last change before the run: no check refuses it after
            adapting = True
            add_adapters(model, settings.resolved_lora_rank, settings.resolved_lora_alpha, settings.seed)
        trainable = select_trainable(model, settings.trainable, added, unused_parameters(model))
        _warn_of_coarse_position_parameters(model, added)
        checkpoint = last_checkpoint(Path(args.output_dir), args.world_size) if settings.resume else None
        if checkpoint is not None:
            check_checkpoint_files(checkpoint)
        PartialState().wait_for_everyone()  # every process has checked output_dir before the first file is written
        if args.should_save:  # the lock held from the run's record on: a second run resuming now is refused
            held.enter_context(run_lock(Path(args.output_dir)))
            _write_json(Path(args.output_dir) / RUN_FILE, identity)
        read_back = []  # its config put back once every process's Trainer has read it, or when the run fails
        if checkpoint is not None:
            read_back.append(held.enter_context(readable_by_the_trainer(checkpoint, trim=args.should_save)))
        PartialState().wait_for_everyone()  # the checkpoint as every process reads it
        clock = _Clock(_seconds_at(checkpoint))
        trainer = PositionRateTrainer(
            model=model,
            args=args,
            train_dataset=data,
            data_collator=default_data_collator,
            processing_class=tokenizer,
            callbacks=[*read_back, clock, _StopIfFinished(), *(callbacks or [])],
            position_parameters=added,
            position_learning_rate=settings.position_learning_rate,
        )
    except BaseException:
        if adapting:
            remove_adapters(model)
        raise
    return _Session(trainer, checkpoint, clock, trainable)


def _train_and_save(
    model: PreTrainedModel, session: _Session, settings: TrainSettings, handed_in: _HandedIn, output_dir: Path
) -> TrainResult:
    """Run the Trainer and save the model, adapters merged; what it did."""
    trainer, clock = session.trainer, session.clock
    clock.start()
    try:
        trainer.train(resume_from_checkpoint=session.checkpoint)
        seconds = clock.seconds()
    except _Finished:  # the model holds its last checkpoint's weights (saved again below); no time was trained
        seconds = clock.earlier
    finally:  # the model saved, or handed back stopped (patched, with the weights it has: a checkpoint's loaded, or
        # some steps taken), generates with its KV cache as before, adapters merged
        handed_in.restore_cache_setting(model)
        if settings.trainable == "lora":
            merge_adapters(model)
    trainer.save_model(str(output_dir))
    model.eval()
    losses = [(entry["step"], entry["loss"]) for entry in trainer.state.log_history if "loss" in entry]
    final = losses[-1][1] if losses else math.nan
    return TrainResult(final, losses, trainer.state.global_step, seconds, session.trainable)


def _check_patched(
    model: PreTrainedModel, spec: MethodSpec, settings: TrainSettings, device: torch.device, added: frozenset[str]
) -> None:
    """Refuse a run the patched model cannot take: windows longer than its learned position table, a backend without
    a backward where it trains, a position learning rate with no position parameter."""
    rows = learned_table_rows(model)
    if rows is not None and settings.length > rows:
        raise ValueError(
            f"`method` {spec.text!r}: {type(model).__name__} looks positions up in a learned table of {rows} rows, "
            f"shorter than `length` {settings.length}; train at `length` up to {rows}, or with a method that "
            "extends or replaces the table (pi:factor=..., alibi, sinusoidal, t5-bias, nope)."
        )
    _check_backward(model, spec, device)
    if settings.position_learning_rate is not None and not added:
        raise ValueError(
            f"`position_learning_rate` sets the learning rate of the position parameters the patch adds or "
            f"interpolates, and `method` {spec.text!r} has none (t5-bias adds its table, pi interpolates GPT-2's); "
            "leave it out."
        )


def _warn_of_coarse_position_parameters(model: PreTrainedModel, added: frozenset[str]) -> None:
    """A warning where the position parameters train in half precision: an update below about 1/256 (bfloat16) of
    an entry rounds away, so the T5 table's entries, tens of units, stay where they are at usual learning rates."""
    coarse = [
        name for name, parameter in model.named_parameters() if name in added and parameter.dtype != torch.float32
    ]
    if coarse:
        dtype = model.get_parameter(coarse[0]).dtype
        logger.warning(
            "The position parameters (%s) train in %s: an update much smaller than an entry rounds away (in bfloat16, "
            "below about 1/256 of it), so large entries barely move. Load the model in float32 (with `bf16` for "
            "autocast) to train them.",
            ", ".join(coarse),
            dtype,
        )


@dataclass(frozen=True)
class _HandedIn:
    """What :func:`train` changes of a model before the Trainer runs, restored when the run stops before that."""

    training: bool
    device: torch.device | None  # its one device (None: placed over several, which train does not move)
    requires_grad: dict[str, bool]
    use_cache: bool | None  # the config's (the Trainer sets its own, False, there)

    @classmethod
    def of(cls, model: PreTrainedModel) -> _HandedIn:
        devices = {parameter.device for parameter in model.parameters()}
        flags = {name: parameter.requires_grad for name, parameter in model.named_parameters()}
        use_cache = getattr(model.config, "use_cache", None)
        return cls(model.training, devices.pop() if len(devices) == 1 else None, flags, use_cache)

    def restore(self, model: PreTrainedModel) -> None:
        if self.device is not None:
            model.to(self.device)
        model.train(self.training)
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(self.requires_grad.get(name, parameter.requires_grad))
        self.restore_cache_setting(model)

    def restore_cache_setting(self, model: PreTrainedModel) -> None:
        if self.use_cache is not None:
            model.config.use_cache = self.use_cache


def _check_backward(model: PreTrainedModel, spec: MethodSpec, device: torch.device) -> None:
    """Refuse a backend that has no backward where the model trains: torch's flex attention on a CPU (it would
    fail at the first step, after the run's record is written)."""
    patched = get_patch(model)
    if patched is not None and patched.params.get("backend") == "flex" and device.type == "cpu":
        raise ValueError(
            f"`method` {spec.text!r}: the flex backend has no backward on a CPU (torch's flex attention); train with "
            "backend=sdpa (or leave the backend to auto), or on a GPU."
        )


class _Finished(Exception):
    """Raised by :class:`_StopIfFinished`."""


class _StopIfFinished(TrainerCallback):
    """Stop a run resumed from the checkpoint of its last step before it trains: the ``Trainer`` would take one
    step more (its loop checks the step count only after each step). The checkpoint is loaded by then."""

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step >= state.max_steps:
            raise _Finished


class _Clock(TrainerCallback):
    """Time in ``Trainer.train`` over the sessions of a run: each checkpoint records the total so far
    (``CLOCK_FILE``), and a resumed session starts from its checkpoint's (:meth:`start` as ``train`` is called)."""

    def __init__(self, earlier: float):
        self.earlier = earlier
        self.started = time.perf_counter()

    def start(self) -> None:
        self.started = time.perf_counter()

    def seconds(self) -> float:
        return self.earlier + time.perf_counter() - self.started

    def on_save(self, args, state, control, **kwargs):
        if args.should_save:
            folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            _write_json(folder / CLOCK_FILE, {"seconds": self.seconds()})


def _seconds_at(checkpoint: str | None) -> float:
    """The training time recorded in ``checkpoint``: 0 with none; 0 and a warning with one that has no record (the
    run was killed between writing the checkpoint and its record)."""
    if checkpoint is None:
        return 0.0
    clock = Path(checkpoint) / CLOCK_FILE
    if not clock.is_file():
        logger.warning("%s records no training time; the summary counts this session's alone.", checkpoint)
        return 0.0
    return json.loads(clock.read_text(encoding="utf-8"))["seconds"]


def _summary(
    model: PreTrainedModel,
    spec: MethodSpec,
    settings: TrainSettings,
    data: PackedWindows,
    result: TrainResult,
    args: TrainingArguments,
    sources: dict[str, Any] | None,
) -> TrainSummary:
    """``train_summary.json``: the method as applied, the settings, the data, the losses, the time, the versions."""
    applied = get_patch(model)
    return TrainSummary(
        method=spec.method,
        spec=spec.text,
        params=applied.params if applied is not None else {},
        model=str(model.name_or_path),
        sources=sources or {},
        settings=settings.recorded(),
        data=TrainData(
            windows=len(data),
            length=data.length,
            bos=data.bos_id is not None,
            stream_tokens=data.stream_tokens,
            dropped_tokens=data.dropped_tokens,
            sha256=data.fingerprint(),
        ),
        trainable_parameters=result.trainable_parameters,
        steps=result.steps,
        final_loss=result.final_loss,
        losses=list(result.losses),
        seconds=result.seconds,
        device=str(args.device),
        bf16=args.bf16,
        world_size=args.world_size,
        versions=_versions(),
    )


def _versions() -> dict[str, str]:
    return {
        "hf_posenc": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
    }


def _write_json(path: Path, record: dict[str, Any]) -> None:
    atomic_write_text(path, json_text(record))  # a NaN loss (no step taken, or a diverged run) is null
