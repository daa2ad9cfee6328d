"""The flex backend of the remap methods: ``flex_attention`` with block masks, memory linear in the length.

Each segment needs its own q and k (re-rotated to its positions), and flex computes ``q . k`` itself, so the
segments cannot share one plain call. Two exact ways to one softmax over all of them:

* CUDA: one call per segment whose block mask holds only that segment's pairs, ``return_lse=True``, the outputs
  weighted by ``exp(lse_g - lse)``; each call skips the blocks its segment does not reach.
* CPU (where flex cannot return the log-sum-exp when compiled): one call on the segments laid side by side:
  queries ``[q_0 | q_1 | ...]`` along the head dimension, keys ``S`` copies along the sequence, copy ``g``
  holding ``k_g`` in its own slice of the head dimension and zeros elsewhere, so ``q . k`` of copy ``g`` is
  ``q_g . k_g``; the block mask keeps, for each pair, the copy of its segment.

Compiled on CUDA and, on a CPU, for inputs of :data:`CPU_COMPILE_FROM` query x key pairs and more (compiling
takes seconds; below that the uncompiled reference of flex, which materialises the scores, is cheaper). On CUDA
the segment calls go through :func:`~hf_posenc.attention.compiled_flex.compiled_flex` (a prefill compiled for
its shapes, as ALiBi's), and the re-rotation of q and k and the merge are compiled too: one fused pass each
instead of a float32 copy per elementwise step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

try:  # torch >= 2.9: return_lse is deprecated there
    from torch.nn.attention.flex_attention import AuxRequest
except ImportError:  # pragma: no cover - older torch
    AuxRequest = None

from .compiled_flex import compiled_flex
from .extension import ExtensionState, PositionMask, prepared, rotate, segment_states, torch_compiled

CPU_COMPILE_FROM = 4096 * 4096


def _compiles(device: torch.device, pairs: int) -> bool:
    return device.type == "cuda" or pairs >= CPU_COMPILE_FROM


def _on_cuda(mask: PositionMask) -> bool:
    return mask.query_positions.is_cuda


def _block_mask(mask: PositionMask, key: Any, mask_mod: Callable[[], Any], kv_length: int, compiled: bool) -> BlockMask:
    """The block mask of ``mask_mod()``, built once per call of the model (all layers share the mask). ``key`` names
    the remap with its parameters, as the mask's rotations do: a mask given to two methods (a benchmark's) gives
    each its own."""
    if key not in mask.block_masks:
        build = torch_compiled(create_block_mask, _on_cuda(mask)) if compiled else create_block_mask
        shape = dict(B=mask.query_positions.shape[0], H=None, Q_LEN=mask.query_positions.shape[1], KV_LEN=kv_length)
        mask.block_masks[key] = build(mask_mod=mask_mod(), device=mask.query_positions.device, **shape)
    return mask.block_masks[key]


def _pair_rule(state: ExtensionState, mask: PositionMask) -> Any:
    """``rule(batch, i_index, j_index, segment)``: whether the pair attends, in that segment. Everything it reads
    is a tensor (no Python branch on the call's values), so compiled flex traces it once for all calls."""
    remap, qpos, kpos = state.remap, mask.query_positions, mask.key_positions
    valid = mask.key_valid if mask.key_valid is not None else torch.ones_like(kpos, dtype=torch.bool)

    def rule(batch, q_idx, kv_idx, segment):
        i, j = qpos[batch, q_idx], kpos[batch, kv_idx]
        return (j <= i) & (remap.segment_of(i, j) == segment) & valid[batch, kv_idx]

    return rule


def _with_lse(attend: Any, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``flex_attention`` returning its output and log-sum-exp (``return_aux`` where this torch has it)."""
    if AuxRequest is None:
        return attend(*args, return_lse=True, **kwargs)
    output, aux = attend(*args, return_aux=AuxRequest(lse=True), **kwargs)
    return output, aux.lse


def _merged(outputs: list[torch.Tensor], lses: list[torch.Tensor]) -> torch.Tensor:
    """The segments' outputs ``(B, H, q, D)`` weighted by ``exp(lse_g - lse)``: one softmax over all their keys,
    in float32, returned in the outputs' dtype. A row with no key at all gets 0, and its gradient too (not the
    NaN of ``-inf - -inf``)."""
    lse = torch.stack([part.float() for part in lses])  # (segments, B, H, q)
    reached = torch.isfinite(lse).any(0)
    lse = torch.where(reached, lse, 0.0)
    weights = torch.where(reached, torch.exp(lse - torch.logsumexp(lse, 0)), 0.0)
    merged = sum(weight[..., None] * output.float() for weight, output in zip(weights, outputs, strict=True))
    return merged.to(outputs[0].dtype)


def _segment_mask_mod(rule: Any, segment: int, device: torch.device) -> Callable[[], Any]:
    """The mask_mod of one segment, made only where its block mask is built (the first layer)."""

    def make() -> Any:
        index = torch.tensor(segment, device=device)  # a tensor: one trace for every segment

        def mask_mod(batch, head, q_idx, kv_idx):
            return rule(batch, q_idx, kv_idx, index)

        return mask_mod

    return make


def _per_segment(state: ExtensionState, mask: PositionMask, query, key, value, scaling: float, compiled: bool):
    """CUDA's strategy: one flex call per segment, merged by log-sum-exp (compiled there, as ``compiled``)."""
    rule, kv_length = _pair_rule(state, mask), key.shape[2]
    attend = functools.partial(compiled_flex, "remap segment") if compiled else flex_attention
    turn = torch_compiled(rotate, True) if compiled else rotate
    outputs, lses = [], []
    for segment, (seg_query, seg_key) in enumerate(segment_states(state, mask, query, key, query.dtype, turn)):
        mask_mod = _segment_mask_mod(rule, segment, query.device)
        output, lse = _with_lse(
            attend,
            seg_query,
            seg_key,
            value,
            block_mask=_block_mask(mask, (state.remap, "segment", segment), mask_mod, kv_length, compiled),
            scale=scaling,
            enable_gqa=query.shape[1] != key.shape[1],
        )
        outputs.append(output)
        lses.append(lse)
    return (torch_compiled(_merged, True) if compiled else _merged)(outputs, lses)  # (B, H, q, D)


def _side_by_side(state: ExtensionState, mask: PositionMask, query, key, value, scaling: float, compiled: bool):
    rule, kv_length, dim = _pair_rule(state, mask), key.shape[2], key.shape[3]
    segments = len(state.remap.SEGMENTS)
    queries, keys = [], key.new_zeros(key.shape[0], key.shape[1], segments * kv_length, segments * dim)
    for segment, (seg_query, seg_key) in enumerate(segment_states(state, mask, query, key, query.dtype)):
        queries.append(seg_query)
        keys[:, :, segment * kv_length : (segment + 1) * kv_length, segment * dim : (segment + 1) * dim] = seg_key

    def mask_mod(batch, head, q_idx, kv_idx):
        return rule(batch, q_idx, kv_idx % kv_length, kv_idx // kv_length)

    attend = torch_compiled(flex_attention, query.is_cuda) if compiled else flex_attention
    output = attend(
        torch.cat(queries, -1),  # (B, H, q, S * D)
        keys,  # (B, H_kv, S * kv, S * D)
        value.repeat(1, 1, segments, 1),  # (B, H_kv, S * kv, D)
        block_mask=_block_mask(mask, (state.remap, "side by side"), lambda: mask_mod, segments * kv_length, compiled),
        scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return output  # a query with no key at all (a padding row) gets 0


def extension_flex_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: PositionMask,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Self-Extend / DCA with ``flex_attention`` (see the module docstring for the two strategies).

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
    compiled = _compiles(query.device, query.shape[2] * key.shape[2])
    strategy = _per_segment if query.device.type == "cuda" else _side_by_side
    output = strategy(state, mask, query, key, value, scaling, compiled)
    return output.transpose(1, 2).contiguous(), None  # (B, q, H, D)
