"""How a fine-tune trains (:class:`TrainSettings`): light to import, so that ``hf-posenc train --help`` reads the
settings' help from here without torch."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from dataclasses import dataclass
from typing import Any

from ..fields import documented, setting

TRAINABLE = ("all", "position", "lora")
DEFAULT_LORA_RANK = 16


@documented
@dataclass(frozen=True, kw_only=True)
class TrainSettings:
    """How to train. A model not in float32 trains in its own dtype."""

    length: int = setting(help="tokens per training window, BOS included (the context to train at)")
    steps: int = setting(help="optimizer steps")
    learning_rate: float = setting(1e-4, help="peak learning rate (AdamW, linear decay to 0)")
    position_learning_rate: float | None = setting(
        None,
        help="peak learning rate of the position parameters as patched: the T5 table (whose values are tens of "
        "units: at 1e-4 fifty steps move them by 1e-3; try 1e-2), or GPT-2's table as pi interpolates it. None: "
        "learning_rate",
    )
    batch_size: int = setting(1, help="windows per device per forward")
    gradient_accumulation_steps: int = setting(1, help="forwards per optimizer step")
    warmup_steps: int = setting(0, help="steps of linear warm-up to learning_rate")
    trainable: str = setting(
        "all",
        help="all; position: only the position parameters as patched (what the patch adds, or GPT-2's table pi "
        "interpolates) and the normalisation weights; lora: those and LoRA adapters on every linear layer but the "
        "output layer, merged into the weights at the end (needs peft)",
    )
    lora_rank: int | None = setting(None, help=f"the adapters' rank r (trainable lora only); None: {DEFAULT_LORA_RANK}")
    lora_alpha: float | None = setting(
        None, help="the adapters' alpha, their update scaled by alpha / r (trainable lora only); None: 2 r"
    )
    save_steps: int = setting(
        500, help="a checkpoint (model, optimizer, scheduler, RNG) every N steps; the last two are kept"
    )
    seed: int = setting(0, help="seed of the data order and of the Trainer")
    gradient_checkpointing: bool = setting(False, help="recompute activations in the backward (less memory)")
    bf16: bool | None = setting(
        None,
        help="train a float32 model in bfloat16 autocast (the weights and the optimizer state stay float32). None: "
        "where a CUDA GPU supports bfloat16; on a CPU only when asked (it pays where the CPU has AVX512-BF16 or AMX)",
    )
    resume: bool = setting(
        False,
        help="continue the run in the output folder from its last checkpoint (the same model, method, data and "
        "settings); with no run there, start one",
    )

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
        (so a run file without them compares alike); ``resume`` left out (how it was started, not what)."""
        settings = {key: value for key, value in dataclasses.asdict(self).items() if not key.startswith("lora_")}
        del settings["resume"]
        if self.trainable == "lora":
            settings |= {"lora_rank": self.resolved_lora_rank, "lora_alpha": self.resolved_lora_alpha}
        return settings


def _whole(value: object) -> bool:
    """An ``int`` that is not a ``bool`` (``True`` would read as one step)."""
    return isinstance(value, int) and not isinstance(value, bool)


def require_peft() -> None:
    """Raise ``ValueError`` unless peft can be imported."""
    if importlib.util.find_spec("peft") is None:
        raise ValueError("`trainable` 'lora' needs peft: pip install 'hf-posenc[lora]' (or peft).")
