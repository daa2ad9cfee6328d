"""LongRoPE (Ding et al. 2024, arXiv 2402.13753): searched per-pair rescale factors."""

from __future__ import annotations

import math
from collections.abc import Mapping, Set
from dataclasses import dataclass

import torch

from ..fields import documented, setting
from ..registry import Method, register
from ._common import ScaledRopeParams, attention_scale, positive_number, rope_inv_freq


def _factor_list(name: str, values) -> tuple[float, ...]:
    if isinstance(values, (str, bytes, Mapping, Set)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a list of numbers (one per rotary pair), got {values!r}.")
    return tuple(positive_number(f"{name}[{i}]", value) for i, value in enumerate(values))


@documented
@dataclass(frozen=True, kw_only=True)
class LongRoPEParams(ScaledRopeParams):
    """LongRoPE: a searched factor per pair past ``L`` (Ding et al. 2024); ``factor`` sets the attention factor."""

    long_factor: tuple[float, ...] = setting(help="``lambda_i`` per pair (``head_dim // 2`` values), used past ``L``.")
    short_factor: tuple[float, ...] | None = setting(
        None,
        help="used up to ``L``; defaults to all ones (the unscaled frequencies; the attention factor still applies, as"
        " in transformers and Phi-3).",
    )
    attention_factor: float | None = setting(None, help="defaults to ``sqrt(1 + ln s / ln L)`` (paper §3.3 / Phi-3).")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("long_factor", _factor_list("long_factor", self.long_factor))
        if self.short_factor is not None:
            self._set("short_factor", _factor_list("short_factor", self.short_factor))
        if self.attention_factor is not None:
            self._set("attention_factor", attention_scale("attention_factor", self.attention_factor))
        elif self.original_max_position_embeddings is not None:
            self._set("attention_factor", longrope_attention_factor(self.factor, self.context))


def longrope_attention_factor(factor: float, context: int) -> float:
    """``sqrt(1 + ln s / ln L)`` (1 for ``s <= 1``); needs ``L >= 2`` when ``s > 1`` (``ln 1 = 0``)."""
    if factor <= 1:
        return 1.0
    if context < 2:
        raise ValueError(
            f"original_max_position_embeddings must be >= 2 for LongRoPE's default attention factor "
            f"sqrt(1 + ln s / ln L) (ln 1 = 0), got {context!r}; give attention_factor to use it."
        )
    return math.sqrt(1 + math.log(factor) / math.log(context))


def _rescale(params: LongRoPEParams, head_dim: int, seq_len: int | None) -> tuple[float, ...]:
    pairs = head_dim // 2
    for name in ("long_factor", "short_factor"):
        values = getattr(params, name)
        if values is not None and len(values) != pairs:
            raise ValueError(
                f"{name} has {len(values)} values; this model's rotary dimension {head_dim} needs {pairs} "
                f"(one per pair)."
            )
    if seq_len is not None and seq_len > params.context:
        return params.long_factor
    return params.short_factor or (1.0,) * pairs


def longrope_frequencies(
    params: LongRoPEParams, *, head_dim: int, base: float, seq_len=None, dtype=torch.float64, device=None
) -> tuple[torch.Tensor, float]:
    """LongRoPE (Ding et al., 2024, arXiv 2402.13753): ``theta_i' = theta_i / lambda_i``, with the per-pair rescale
    factors ``lambda_i`` of ``long_factor`` past ``L`` (``seq_len > L``), those of ``short_factor`` otherwise (all
    ones where it is not given).

    Args:
        params (`LongRoPEParams`): ``long_factor``, ``short_factor``, ``factor``, ``attention_factor`` and the
            trained context ``L``.
        head_dim (`int`): the rotary dimension ``d``; each factor list holds ``d // 2`` values.
        base (`float`): the RoPE base ``b`` (``rope_theta``).
        seq_len (`int`, *optional*): the current length ``l``; None takes the short factors.
        dtype (`torch.dtype`, defaults to float64): dtype of the returned ``inv_freq``.
        device (`torch.device` or `str`, *optional*): where ``inv_freq`` is made.

    Returns:
        `tuple[torch.Tensor, float]`: ``theta_i'`` (``d // 2`` values) and the attention factor (``attention_factor``,
        else ``sqrt(1 + ln s / ln L)``), at every length.

    Raises:
        ValueError: a factor list whose length is not ``d // 2``, ``L < 2`` for the default attention factor, or
            ``head_dim`` or ``base`` out of range (:func:`~hf_posenc.methods._common.rope_inv_freq`).
    """
    rescale = torch.tensor(_rescale(params, head_dim, seq_len), dtype=torch.float64, device=device)
    attention = params.attention_factor or longrope_attention_factor(params.factor, params.context)
    return (rope_inv_freq(head_dim, base, device=device) / rescale).to(dtype), attention


def longrope_transformers_rope(params: LongRoPEParams, head_dim: int, base: float) -> dict:
    return {
        "rope_type": "longrope",
        "factor": params.factor,
        "long_factor": list(params.long_factor),
        "short_factor": list(params.short_factor or (1.0,) * (head_dim // 2)),
        "original_max_position_embeddings": params.context,
        "attention_factor": params.attention_factor,
    }


register(
    Method(
        name="longrope",
        params=LongRoPEParams,
        frequencies=longrope_frequencies,
        transformers_rope=longrope_transformers_rope,
        dynamic=True,
        depends_on_length=True,
        paper="Ding et al. 2024, LongRoPE (arXiv 2402.13753)",
        summary="Per-pair factors found by search (e.g. Phi-3's); give your own long_factor list.",
    )
)
