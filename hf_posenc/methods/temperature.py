"""Attention temperature (log-n) scaling: the query at position ``p`` multiplied by a factor >= 1 that grows
with ``p``, so attention entropy stays stable past the trained context ``L``.

* ``variant="qwen"`` (Qwen-7B's ``use_logn_attn``; Chiang & Cholak 2022, Su 2021): ``max(1, ln(p + 1) / ln L)``;
  exactly 1, the unpatched model, for ``p < L``.
* ``variant="llama4"`` (Llama 4's ``attn_temperature_tuning``): ``1 + attn_scale * ln(floor((p + 1) /
  floor_scale) + 1)``; exactly 1 for ``p + 1 < floor_scale``. Llama 4 applies it in its NoPE layers only
  (every fourth, ``no_rope_layers``); here, as for ``"qwen"``, it scales the query of every layer.

Scaling the query commutes with its rotation, so it composes with every RoPE scaling and remap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..fields import documented, setting
from ..registry import Method, register
from ._common import RopeParams, positive_int, positive_number

VARIANTS = ("qwen", "llama4")
LLAMA4_DEFAULTS = {"attn_scale": 0.1, "floor_scale": 8192}
FLOAT16_MAX = torch.finfo(torch.float16).max  # the narrowest dtype a query is scaled in
LONGEST_POSITION = 2**40  # no input is longer (the results files' bound too)


@documented
@dataclass(frozen=True, kw_only=True)
class TemperatureParams(RopeParams):
    """Log-n attention temperature: queries scaled by their position (Qwen's log-n, Llama 4's variant)."""

    variant: str = setting("qwen", help='``"qwen"`` or ``"llama4"``.')
    attn_scale: float | None = setting(
        None,
        help='Llama 4\'s slope of the log; defaults to 0.1 (``variant="llama4"`` only).',
    )
    floor_scale: int | None = setting(
        None,
        help='Llama 4\'s position bucket; defaults to 8192 (``variant="llama4"`` only).',
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.variant not in VARIANTS:
            raise ValueError(f"Unknown log-n variant {self.variant!r}. Available variants: {', '.join(VARIANTS)}.")
        if self.variant == "qwen":
            given = [name for name in LLAMA4_DEFAULTS if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{', '.join(given)} belong to variant='llama4'; the qwen variant has none.")
            if self.original_max_position_embeddings == 1:
                raise ValueError("The qwen variant divides by ln L, so the trained context L must be > 1, got 1.")
            return
        for name, check in (("attn_scale", positive_number), ("floor_scale", positive_int)):
            value = getattr(self, name)
            self._set(name, check(name, LLAMA4_DEFAULTS[name] if value is None else value))
        most = (FLOAT16_MAX - 1.0) / math.log(LONGEST_POSITION / self.floor_scale + 1)
        if self.attn_scale > most:
            raise ValueError(
                f"attn_scale must be at most {most:.4g} with floor_scale={self.floor_scale} (the factor 1 + attn_scale "
                f"* ln(floor((p + 1) / floor_scale) + 1) must stay finite in float16 up to p = 2**40), got "
                f"{self.attn_scale!r}."
            )

    def scale(self, positions: torch.Tensor) -> torch.Tensor:
        """The factor multiplying the query at each position (float64, same shape); 1 for positions < 0
        (padding)."""
        p = positions.to(torch.float64).clamp(min=0)
        if self.variant == "qwen":
            return (torch.log(p + 1) / math.log(self.context)).clamp(min=1.0)
        buckets = torch.floor((p + 1) / self.floor_scale)
        return 1.0 + self.attn_scale * torch.log(buckets + 1)


register(
    Method(
        name="logn",
        aliases=("temperature", "log-n"),
        params=TemperatureParams,
        role="temperature",
        depends_on_length=False,
        paper="Qwen-7B's log-n attention scaling (Bai et al. 2023, arXiv 2309.16609); Llama 4's attention "
        "temperature tuning",
        summary="Training-free: queries past L scaled by ln(p+1)/ln L; alone, or with a RoPE scaling or remap "
        "('dynamic-ntk+logn', 'self-extend+logn').",
    )
)
