"""The query-block backends of the remap methods (Self-Extend, DCA): memory ``O(block * n)``.

Queries go in blocks of :data:`BLOCK` rows. In a block, each segment needs only the keys its pairs can reach
there (:meth:`~hf_posenc.methods.remap.RemapParams.key_span`), with its own re-rotated q and k. Two ways to one
softmax over them:

* ``blocked``: each segment's float32 logits over its key range, concatenated, one softmax (explicit matmuls).
* ``sdpa``: one ``scaled_dot_product_attention`` call per block on the segments laid side by side: queries
  ``[q_0 | q_1 | ...]`` along the head dimension, segment ``g``'s keys holding ``k_g`` in slice ``g`` of the
  head dimension and zeros elsewhere (so their dot product is ``q_g . k_g``), a boolean mask keeping each pair
  in its segment's copy. The fused kernel never materialises the float32 logits. A prefill, left-padded or
  not (and without a gradient to carry), takes the tiles of :mod:`~hf_posenc.attention.extension_tiles` instead:
  a few causal or full fused calls per segment, merged by log-sum-exp.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import extension_tiles
from .extension import (
    ExtensionState,
    PositionMask,
    grouped_output,
    grouped_scores,
    masked_softmax,
    prepared,
    segment_keys,
    segment_queries,
)

BLOCK = 1024  # query rows per block


@dataclass(eq=False)
class SegmentBlock:
    """One segment's share of a query block: its q (the block's rows) and k (its key range) as it sees them,
    which pairs of the two it holds ``(B, 1, rows, keys)``, and the values of its keys."""

    query: torch.Tensor
    key: torch.Tensor
    allowed: torch.Tensor
    value: torch.Tensor


def _key_range(positions: torch.Tensor, lo: int, hi: int) -> tuple[int, int]:
    """Indices ``[start, stop)`` covering, in every row, the keys whose positions lie in ``lo .. hi``."""
    bounds = torch.tensor([lo, hi], device=positions.device)
    start = torch.searchsorted(positions, bounds[:1].expand(positions.shape[0], 1).contiguous())
    stop = torch.searchsorted(positions, bounds[1:].expand(positions.shape[0], 1).contiguous(), right=True)
    return int(start.min()), int(stop.max())


def _blocks(
    state: ExtensionState, mask: PositionMask, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> Iterator[tuple[slice, list[SegmentBlock]]]:
    """Each query block's rows and its segments (those that reach a key there; none for padding queries before
    any token). Keys are turned once for every block, one turn per ``key_source`` (shared by the segments that
    turn them alike; memory linear in the length)."""
    qpos, kpos = mask.query_positions, mask.key_positions.contiguous()
    keys: dict[int, torch.Tensor] = {}
    for start in range(0, query.shape[2], BLOCK):
        rows = slice(start, start + BLOCK)
        first, last = int(qpos[:, rows].min()), int(qpos[:, rows].max())
        parts = []
        for segment in range(len(state.remap.SEGMENTS)):
            begin, end = _key_range(kpos, *state.remap.key_span(segment, first, last))
            if begin >= end:
                continue
            cols = slice(begin, end)
            q_here, k_here = qpos[:, rows], kpos[:, cols]
            here = state.remap.segment_of(q_here[:, None, :, None], k_here[:, None, None, :]) == segment
            source = state.remap.key_source(segment)
            if source not in keys:
                keys[source] = segment_keys(state, mask, source, key)
            block_query = segment_queries(state, mask, segment, query[:, :, rows], rows)
            allowed = mask.allowed(rows, cols) & here
            parts.append(SegmentBlock(block_query, keys[source][:, :, cols], allowed, value[:, :, cols]))
        yield rows, parts


def _no_keys(query: torch.Tensor, rows: slice, value: torch.Tensor) -> torch.Tensor:
    """The output ``(B, rows, H, D)`` of query rows that attend to nothing: zeros."""
    return value.new_zeros(query.shape[0], query[:, :, rows].shape[2], query.shape[1], value.shape[-1])


Kernel = Callable[[list[SegmentBlock], float, torch.Tensor], torch.Tensor]


def _by_blocks(
    kernel: Kernel,
    state: ExtensionState,
    mask: PositionMask,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float,
) -> torch.Tensor:
    """``kernel(parts, scaling, value)`` on each query block's segments, ``(B, rows, H, D)``; rows with no key at
    all (padding before any token) get zeros."""
    outputs = [
        kernel(parts, scaling, value) if parts else _no_keys(query, rows, value)
        for rows, parts in _blocks(state, mask, query, key, value)
    ]
    return torch.cat(outputs, 1)


def extension_blocked_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: PositionMask,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Query blocks of :data:`BLOCK` rows; each segment's float32 logits only over the keys it reaches there.

    Args:
        module (`nn.Module`): the patched attention module (its ``hf_posenc_extension`` state).
        query (`torch.Tensor`): ``(B, H, q, D)``, rotated at the true positions.
        key (`torch.Tensor`): ``(B, H_kv, kv, D)``, rotated at the true positions.
        value (`torch.Tensor`): ``(B, H_kv, kv, D)``.
        attention_mask (`PositionMask`): what :func:`~hf_posenc.attention.extension.extension_mask` made.
        scaling (`float`): the logits' scale.
        dropout (`float`, defaults to 0.0): must be 0 in training (no attention dropout).
        **kwargs: the model's other attention arguments; ``position_ids`` checked on the first layer.

    Returns:
        `tuple[torch.Tensor, None]`: the output ``(B, q, H, D)``, and no weights.

    Raises:
        ValueError: as :func:`~hf_posenc.attention.extension.prepared` refuses the call.
    """
    state, mask, query = prepared(module, query, attention_mask, dropout, kwargs)
    return _by_blocks(_float32_logits, state, mask, query, key, value, scaling), None


def extension_sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: PositionMask,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A prefill, left-padded or not, as tiles (:mod:`~hf_posenc.attention.extension_tiles`, where it applies);
    any other call in query blocks of :data:`BLOCK` rows, per block one SDPA call on the segments side by side
    (module docstring). In the model's dtype; a query with no key (padding before any token) gets 0.

    Args:
        module (`nn.Module`): the patched attention module (its ``hf_posenc_extension`` state).
        query (`torch.Tensor`): ``(B, H, q, D)``, rotated at the true positions.
        key (`torch.Tensor`): ``(B, H_kv, kv, D)``, rotated at the true positions.
        value (`torch.Tensor`): ``(B, H_kv, kv, D)``.
        attention_mask (`PositionMask`): what :func:`~hf_posenc.attention.extension.extension_mask` made.
        scaling (`float`): the logits' scale.
        dropout (`float`, defaults to 0.0): must be 0 in training (no attention dropout).
        **kwargs: the model's other attention arguments; ``position_ids`` checked on the first layer.

    Returns:
        `tuple[torch.Tensor, None]`: the output ``(B, q, H, D)``, and no weights.

    Raises:
        ValueError: as :func:`~hf_posenc.attention.extension.prepared` refuses the call.
    """
    state, mask, query = prepared(module, query, attention_mask, dropout, kwargs)
    starts = extension_tiles.tile_starts(mask, query, key, value)
    if starts is not None:
        return extension_tiles.tiled_attention(state, mask, query, key, value, scaling, starts), None
    return _by_blocks(_fused_call, state, mask, query, key, value, scaling), None


def _float32_logits(parts: list[SegmentBlock], scaling: float, value: torch.Tensor) -> torch.Tensor:
    """Each segment's float32 logits over its keys in the block, one softmax: ``(B, rows, H, D)``."""
    scores = [grouped_scores(p.query, p.key, scaling).masked_fill(~p.allowed, -torch.inf) for p in parts]
    return grouped_output(masked_softmax(torch.cat(scores, -1)), torch.cat([p.value for p in parts], 2))


def _side_by_side(parts: list[SegmentBlock], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Queries ``(B, H, r, S*D)``, keys and values ``(B, H_kv, sum k, S*D)`` and mask ``(B, 1, r, sum k)`` of the
    block's segments side by side (one segment: as they are). The values fill the first ``D`` of the ``S*D``
    dimensions (zeros after): PyTorch's fused CPU kernel takes only values as wide as the queries."""
    if len(parts) == 1:
        (part,) = parts
        return part.query.to(dtype), part.key.to(dtype), part.value, part.allowed
    first, value = parts[0].key, parts[0].value
    dim, lengths, width = first.shape[-1], [p.key.shape[2] for p in parts], len(parts) * first.shape[-1]
    keys = first.new_zeros(first.shape[0], first.shape[1], sum(lengths), width, dtype=dtype)
    values = value.new_zeros(value.shape[0], value.shape[1], sum(lengths), max(width, value.shape[-1]))
    offset = 0
    for index, (part, length) in enumerate(zip(parts, lengths, strict=True)):
        keys[:, :, offset : offset + length, index * dim : (index + 1) * dim] = part.key
        values[:, :, offset : offset + length, : value.shape[-1]] = part.value
        offset += length
    queries = torch.cat([p.query.to(dtype) for p in parts], -1)
    return queries, keys, values, torch.cat([p.allowed for p in parts], -1)


def _fused_call(parts: list[SegmentBlock], scaling: float, value: torch.Tensor) -> torch.Tensor:
    """One SDPA call on the segments side by side (module docstring), in the model's dtype: ``(B, rows, H, D)``."""
    block_query, block_key, block_value, allowed = _side_by_side(parts, value.dtype)
    output = F.scaled_dot_product_attention(
        block_query,
        block_key,
        block_value,
        attn_mask=allowed,
        scale=scaling,
        enable_gqa=block_query.shape[1] != block_key.shape[1],
    )[..., : value.shape[-1]]  # (B, H, r, D)
    output = output.masked_fill(~allowed.any(-1, keepdim=True), 0.0)  # rows with no key: NaN in SDPA
    return output.transpose(1, 2)
