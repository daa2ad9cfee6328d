"""transformers' ``TrainingArguments`` for a run's :class:`~hf_posenc.training.settings.TrainSettings`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from transformers import PreTrainedModel, TrainingArguments

from .settings import TrainSettings

SAVE_TOTAL_LIMIT = 2  # checkpoints kept (model + optimizer state each): the last two, enough to resume

# TrainingArguments' name for it: transformers after 5.18 renamed gradient_checkpointing (read still, with a warning)
_CHECKPOINTING_ARGUMENT = next(
    name
    for name in ("activation_checkpointing", "gradient_checkpointing")
    if name in {field.name for field in dataclasses.fields(TrainingArguments)}
)


def resolved_bf16(model: PreTrainedModel, settings: TrainSettings) -> bool:
    """``settings.bf16``, where None is: on a CUDA GPU that has bfloat16, for a float32 model."""
    if settings.bf16 is not None:
        return settings.bf16
    return torch.cuda.is_available() and model.dtype == torch.float32 and torch.cuda.is_bf16_supported()


def training_arguments(model: PreTrainedModel, output_dir: Path, settings: TrainSettings) -> TrainingArguments:
    """The Trainer's arguments for ``settings``: bf16 autocast where asked (by default on a CUDA GPU that has it),
    checkpoints every ``save_steps`` (the last two kept), a loss logged every step."""
    cuda = torch.cuda.is_available()
    bf16 = resolved_bf16(model, settings)
    return TrainingArguments(
        output_dir=str(output_dir),
        max_steps=settings.steps,
        per_device_train_batch_size=settings.batch_size,
        gradient_accumulation_steps=settings.gradient_accumulation_steps,
        learning_rate=settings.learning_rate,
        warmup_steps=settings.warmup_steps,
        save_strategy="steps",
        save_steps=settings.save_steps,
        save_total_limit=SAVE_TOTAL_LIMIT,
        logging_steps=1,
        seed=settings.seed,
        report_to="none",
        use_cpu=not cuda,
        bf16=bf16,
        remove_unused_columns=False,
        **{_CHECKPOINTING_ARGUMENT: settings.gradient_checkpointing},
    )
