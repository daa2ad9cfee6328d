"""T5 relative-bias attention functions (Raffel et al. 2020, §2.1), with transformers' attention-function
signature, one per backend. They take the masks of the ALiBi backends (:mod:`hf_posenc.attention.masks`),
which carry each query's and key's position in its own sequence, and add ``table[bucket(i - j), h]``.

The patched attention module holds ``t5_position_bias`` (the ``nn.Embedding(num_buckets, num_heads)`` shared
by every layer and registered on the decoder, so it trains and saves) and ``t5_bucketing`` (``num_buckets,
max_distance``). The bias is computed in float32 and gradients reach the table on every backend.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.attention.flex_attention import flex_attention

from ..methods.t5_bias import t5_buckets
from . import masks
from .functions import _check_mask, _compiled_flex_attention, _no_dropout, _repeat_kv
from .masks import AlibiBlockMask


def _table(module: nn.Module) -> tuple[torch.Tensor, int, int]:
    """``(table (num_buckets, H) float32, num_buckets, max_distance)`` of a patched attention module."""
    if not hasattr(module, "t5_position_bias"):
        raise RuntimeError(
            f"{type(module).__name__} has no T5 bias table: the hf_posenc_t5_* attention implementations serve models "
            "patched with hf_posenc.patch(model, 't5-bias'), not ones switched to them by hand."
        )
    return module.t5_position_bias.weight.float(), *module.t5_bucketing


def t5_bias(module: nn.Module, distance_mask: torch.Tensor) -> torch.Tensor:
    """``(B, 1, q, kv)`` negative distances ``-(i - j)`` (``-inf`` where masked) -> ``(B, H, q, kv)`` float32 bias
    ``table[bucket(i - j), h]``, ``-inf`` where masked."""
    table, num_buckets, max_distance = _table(module)
    allowed = distance_mask.isfinite()
    distance = torch.where(allowed, -distance_mask, 0).long()  # (B, 1, q, kv), i - j
    buckets = t5_buckets(distance[:, 0], num_buckets=num_buckets, max_distance=max_distance)  # (B, q, kv)
    bias = table[buckets].permute(0, 3, 1, 2)  # (B, q, kv, H) -> (B, H, q, kv)
    return bias.masked_fill(~allowed, -torch.inf)


def t5_eager_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: scores, bias and softmax in float32, the full ``(B, H, q, kv)`` bias materialised."""
    _check_mask(attention_mask, torch.Tensor, "t5-bias eager")
    groups = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    scores = torch.matmul(query.float(), key.float().transpose(2, 3)) * scaling  # (B, H, q, kv)
    weights = torch.softmax(scores + t5_bias(module, attention_mask), dim=-1).to(value.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()  # (B, q, H, D)
    return output, weights


def t5_sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``scaled_dot_product_attention`` with the bias as a float mask built per call (O(n^2) memory)."""
    _check_mask(attention_mask, torch.Tensor, "t5-bias sdpa")
    groups = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    bias = t5_bias(module, attention_mask).to(query.dtype)  # (B, H, q, kv)
    output = nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=bias, dropout_p=dropout if module.training else 0.0, scale=scaling
    )
    return output.transpose(1, 2).contiguous(), None  # (B, q, H, D)


def t5_flex_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: AlibiBlockMask,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``flex_attention`` with the bucket computed and looked up in the score_mod: memory O(n), compiled on CUDA
    (uncompiled on CPU, a small-size check)."""
    _check_mask(attention_mask, AlibiBlockMask, "t5-bias flex")
    _no_dropout(module, dropout, "t5-bias flex")
    table, num_buckets, max_distance = _table(module)
    queries, keys, shift = attention_mask.query_positions, attention_mask.key_positions, attention_mask.index_shift

    def bias(distance: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        return table[t5_buckets(distance, num_buckets=num_buckets, max_distance=max_distance), head]

    def score_mod(score, batch, head, q_idx, kv_idx):  # positions looked up (padding)
        return score + bias(queries[batch, q_idx] - keys[batch, kv_idx], head)

    def index_score_mod(score, batch, head, q_idx, kv_idx):  # i - j from the indices and the cache offsets
        return score + bias(q_idx - kv_idx + shift, head)

    attend = _compiled_flex_attention() if masks.compiles_flex(query.device) else flex_attention
    output = attend(
        query,
        key,
        value,
        score_mod=score_mod if shift is None else index_score_mod,
        block_mask=attention_mask.block_mask,
        scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return output.transpose(1, 2).contiguous(), None  # (B, q, H, D)
