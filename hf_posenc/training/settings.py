"""What a training run is asked to do (:class:`TrainSettings`), and the Trainer's arguments that say it."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, TrainingArguments

from .lora import require_peft
from .trainable import TRAINABLE

DEFAULT_LORA_RANK = 16
SAVE_TOTAL_LIMIT = 2  # checkpoints kept (model + optimizer state each): the last two, enough to resume

# TrainingArguments' name for it: transformers after 5.18 renamed gradient_checkpointing (read still, with a warning)
_CHECKPOINTING_ARGUMENT = next(
    name
    for name in ("activation_checkpointing", "gradient_checkpointing")
    if name in {field.name for field in dataclasses.fields(TrainingArguments)}
)


@dataclass(frozen=True, kw_only=True)
class TrainSettings:
    """How to train.

    Args:
        length (`int`): tokens per training window, BOS included (the context to train at).
        steps (`int`): optimizer steps.
        learning_rate (`float`, defaults to 1e-4): peak learning rate (AdamW, linear decay to 0).
        position_learning_rate (`float`, *optional*): peak learning rate of the position parameters as patched: the
            T5 table (whose values are tens of units: at 1e-4 fifty steps move them by 1e-3), or GPT-2's table as
            ``pi`` interpolates it. None: ``learning_rate``.
        batch_size (`int`, defaults to 1): windows per device per forward.
        gradient_accumulation_steps (`int`, defaults to 1): forwards per optimizer step.
        warmup_steps (`int`, defaults to 0): steps of linear warm-up to ``learning_rate``.
        trainable (`str`, defaults to ``"all"``): ``"all"``; ``"position"``: only the position parameters as
            patched and the normalisation weights (:mod:`hf_posenc.training.trainable`); ``"lora"``: those and LoRA
            adapters on every linear layer but the output layer, merged into the weights at the end (needs peft).
        lora_rank (`int`, *optional*): the adapters' rank ``r`` (``trainable="lora"`` only); None: 16.
        lora_alpha (`float`, *optional*): the adapters' ``α``, their update scaled by ``α / r`` (``trainable="lora"``
            only); None: ``2·r``.
        save_steps (`int`, defaults to 500): a checkpoint (model, optimizer, scheduler, RNG) every N steps; the
            last two are kept.
        seed (`int`, defaults to 0): seed of the data order and of the Trainer.
        gradient_checkpointing (`bool`, defaults to `False`): recompute activations in the backward (less memory).
        bf16 (`bool`, *optional*): train a float32 model in bfloat16 autocast (the weights and the optimizer state
            stay float32). Default: where a CUDA GPU supports bfloat16; on a CPU only when asked (it pays where the
            CPU has AVX512-BF16 or AMX, as recent Xeon and EPYC do).
        resume (`bool`, defaults to `False`): continue the run in ``output_dir`` from its last checkpoint (the
            same model, method, data and settings); with no run there, start one.

    A model not in float32 trains in its own dtype.
    """

    length: int
    steps: int
    learning_rate: float = 1e-4
    position_learning_rate: float | None = None
    batch_size: int = 1
    gradient_accumulation_steps: int = 1
    warmup_steps: int = 0
    trainable: str = "all"
    lora_rank: int | None = None
    lora_alpha: float | None = None
    save_steps: int = 500
    seed: int = 0
    gradient_checkpointing: bool = False
    bf16: bool | None = None
    resume: bool = False

    def __post_init__(self) -> None:
        for name in ("length", "steps", "batch_size", "gradient_accumulation_steps", "save_steps", "lora_rank"):
            if (name != "lora_rank" or self.lora_rank is not None) and (
                not _whole(getattr(self, name)) or getattr(self, name) < 1
            ):
                raise ValueError(f"`{name}` must be a positive integer, not {getattr(self, name)!r}.")
        if not _whole(self.warmup_steps) or self.warmup_steps < 0:
            raise ValueError(f"`warmup_steps` must be a whole number, 0 or more, not {self.warmup_steps!r}.")
        for name in ("gradient_checkpointing", "bf16", "resume"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (name == "bf16" and value is None):
                raise ValueError(f"`{name}` must be True or False, not {value!r}.")
        for name in ("learning_rate", "position_learning_rate", "lora_alpha"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"`{name}` must be a positive number, not {value!r}.")
        if self.trainable not in TRAINABLE:
            raise ValueError(f"Unknown `trainable` {self.trainable!r}; choose one of {', '.join(TRAINABLE)}.")
        if self.trainable == "lora":
            require_peft()
        given = [name for name in ("lora_rank", "lora_alpha") if getattr(self, name) is not None]
        if given and self.trainable != "lora":
            names = " and ".join(f"`{name}`" for name in given)
            verb, them = ("sets", "it") if len(given) == 1 else ("set", "them")
            raise ValueError(
                f"{names} {verb} the LoRA adapters of `trainable` 'lora'; leave {them} out with `trainable` "
                f"{self.trainable!r}."
            )
        if not _whole(self.seed) or not 0 <= self.seed < 2**32:
            raise ValueError(f"`seed` must be a whole number from 0 to 2**32 - 1 (numpy's range), not {self.seed!r}.")

    @property
    def resolved_lora_rank(self) -> int:
        """``lora_rank``, where None is 16."""
        return DEFAULT_LORA_RANK if self.lora_rank is None else self.lora_rank

    @property
    def resolved_lora_alpha(self) -> float:
        """``lora_alpha``, where None is ``2·lora_rank``."""
        return float(2 * self.resolved_lora_rank if self.lora_alpha is None else self.lora_alpha)

    def recorded(self) -> dict[str, Any]:
        """The settings as a run records them: the LoRA ones resolved where it trains adapters, left out where not
        (so runs recorded before they existed compare alike); ``resume`` left out (how it was started, not what)."""
        settings = {key: value for key, value in dataclasses.asdict(self).items() if not key.startswith("lora_")}
        del settings["resume"]
        if self.trainable == "lora":
            settings |= {"lora_rank": self.resolved_lora_rank, "lora_alpha": self.resolved_lora_alpha}
        return settings


def _whole(value: object) -> bool:
    """An ``int`` that is not a ``bool`` (``True`` would read as one step)."""
    return isinstance(value, int) and not isinstance(value, bool)


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
