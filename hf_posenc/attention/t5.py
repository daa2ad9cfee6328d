"""T5 relative-bias attention functions (Raffel et al. 2020, §2.1), with transformers' attention-function
signature, one per backend. They take the masks of the ALiBi backends (:mod:`hf_posenc.attention.masks`),
which carry each query's and key's position in its own sequence, and add ``table[bucket(i - j), h]``.

The patched attention module holds ``t5_position_bias`` (the ``nn.Embedding(num_buckets, num_heads)`` shared
by every layer and registered on the decoder, so it trains and saves) and ``t5_bucketing`` (``num_buckets,
max_distance``). The bias is computed in float32 and gradients reach the table on every backend.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..methods.t5_bias import t5_buckets
from .functions import eager_bias_attention, flex_bias_attention, sdpa_bias_attention


def _table(module: nn.Module, device: torch.device) -> tuple[torch.Tensor, int, int]:
    """``(table (num_buckets, H) float32 on device, num_buckets, max_distance)`` of a patched attention module (the
    table may live on another device: a model split over GPUs; gradients flow back through the copy)."""
    if not hasattr(module, "t5_position_bias"):
        raise RuntimeError(
            f"{type(module).__name__} has no T5 bias table: the hf_posenc_t5_* attention implementations serve models "
            "patched with hf_posenc.patch(model, 't5-bias'), not ones switched to them by hand."
        )
    return module.t5_position_bias.weight.to(device=device, dtype=torch.float32), *module.t5_bucketing


def t5_bias(module: nn.Module, distance_mask: torch.Tensor) -> torch.Tensor:
    """``(B, 1, q, kv)`` negative distances ``-(i - j)`` (``-inf`` where masked) -> ``(B, H, q, kv)`` float32 bias
    ``table[bucket(i - j), h]``, ``-inf`` where masked."""
    table, num_buckets, max_distance = _table(module, distance_mask.device)
    allowed = distance_mask.isfinite()
    distance = torch.where(allowed, -distance_mask, 0).long()  # (B, 1, q, kv), i - j
    buckets = t5_buckets(distance[:, 0], num_buckets=num_buckets, max_distance=max_distance)  # (B, q, kv)
    bias = table[buckets].permute(0, 3, 1, 2)  # (B, q, kv, H) -> (B, H, q, kv)
    return bias.masked_fill(~allowed, -torch.inf)


def _t5_score_bias(module: nn.Module, device: torch.device) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    table, num_buckets, max_distance = _table(module, device)
    return lambda distance, head: table[t5_buckets(distance, num_buckets=num_buckets, max_distance=max_distance), head]


t5_eager_attention = eager_bias_attention(t5_bias, "t5-bias")
t5_sdpa_attention = sdpa_bias_attention(t5_bias, "t5-bias")
t5_flex_attention = flex_bias_attention(_t5_score_bias, "t5-bias")
