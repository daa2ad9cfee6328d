"""ALiBi attention masks for transformers' mask interface: what a mask says, plus each token's position.

The bias ``-m_h * (i - j)`` needs the positions of query ``i`` and key ``j`` *in their own sequence*, not
their indices in the batch row. Positions are counted over the 2D attention mask, so masked tokens do not
count wherever they are (with left padding index differences happen to be right; a masked stretch inside
a row shows the difference), from the cache offsets transformers passes to every mask function; a per-row
constant cancels in ``i - j``, so sliced caches and sliding windows give the same distances.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask
from transformers.masking_utils import (
    add_offsets_to_mask_function,
    and_masks,
    causal_mask_function,
    padding_mask_function,
    prepare_padding_mask,
    sdpa_mask,
)


def compiles_flex(device: torch.device | str) -> bool:
    """Whether flex attention and its block masks run compiled there: on CUDA (uncompiled, both are n x n);
    on CPU they run uncompiled, as a small-size check."""
    return torch.device(device).type == "cuda"


@functools.cache
def _compiled_create_block_mask() -> Callable:
    """``create_block_mask`` compiled once with dynamic shapes: new lengths do not recompile it."""
    return torch.compile(create_block_mask, dynamic=True)


def token_positions(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor,
    kv_offset: int,
    attention_mask: torch.Tensor | None,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(query_positions (B, q), key_positions (B, kv))``, int64, counting non-padding tokens only.

    With ``attention_mask``, a token's position is the number of non-padding tokens up to and including it (one more
    than its 0-based position, a constant that cancels in ``i - j``); without, its cache index.

    Args:
        batch_size (`int`): rows ``B``.
        q_length (`int`): queries ``q`` of this call.
        kv_length (`int`): keys ``kv`` of this call.
        q_offset (`int` or `torch.Tensor`): the cache index of the first query.
        kv_offset (`int`): the cache index of the first key.
        attention_mask (`torch.Tensor` or `None`): the 2D ``(B, length)`` padding mask; None: no padding.
        device (`torch.device` or `str`): where the positions are made.
    """
    queries = torch.arange(q_length, device=device) + q_offset  # absolute cache indices
    keys = torch.arange(kv_length, device=device) + kv_offset
    if attention_mask is None:
        return queries.expand(batch_size, -1), keys.expand(batch_size, -1)
    keep = prepare_padding_mask(attention_mask.to(device=device, dtype=torch.bool), kv_length, kv_offset)
    counts = keep.long().cumsum(-1)  # (B, >= kv_offset + kv_length): non-padding tokens up to each index
    return counts[:, queries], counts[:, keys]


def alibi_distance_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int = 0,
    mask_function: Callable = causal_mask_function,
    attention_mask: torch.Tensor | None = None,
    use_vmap: bool = False,
    device: torch.device | str = "cpu",
    **kwargs,
) -> torch.Tensor:
    """Mask function for the eager and SDPA ALiBi backends (transformers' mask-interface signature).

    Args:
        batch_size (`int`): rows ``B``.
        q_length (`int`): queries ``q`` of this call.
        kv_length (`int`): keys ``kv`` of this call.
        q_offset (`int` or `torch.Tensor`, defaults to 0): the cache index of the first query.
        kv_offset (`int`, defaults to 0): the cache index of the first key.
        mask_function (`Callable`, defaults to transformers' causal mask): which (query, key) pairs attend.
        attention_mask (`torch.Tensor`, *optional*): the 2D ``(B, length)`` padding mask.
        use_vmap (`bool`, defaults to `False`): passed on to transformers' ``sdpa_mask``.
        device (`torch.device` or `str`, defaults to ``"cpu"``): where the mask is made.
        **kwargs (`Any`): the mask interface's other arguments, not read.

    Returns:
        `torch.Tensor`: ``(B, 1, q, kv)`` float32, ``-(i - j)`` (positions as in :func:`token_positions`)
        where the query attends to the key, ``-inf`` where it does not. The attention function multiplies
        it by each head's slope (> 0). A query that may attend to nothing (a padding token) attends to
        every key instead: its output is unused, and so it stays finite in the forward and the backward.
    """
    allowed = sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function,
        attention_mask=attention_mask,
        allow_is_causal_skip=False,
        use_vmap=use_vmap,
        device=device,
    )  # (B, 1, q, kv) bool
    allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
    queries, keys = token_positions(batch_size, q_length, kv_length, q_offset, kv_offset, attention_mask, device)
    distance = queries[:, None, :, None] - keys[:, None, None, :]  # (B, 1, q, kv)
    return torch.where(allowed, -distance.float(), -torch.inf)


@dataclass
class AlibiBlockMask:
    """What the flex backend gets as ``attention_mask``: a block mask and O(n) positions, no n x n tensor.

    ``index_shift`` is set where no token is padding: then ``i - j = q_idx - kv_idx + index_shift`` in every
    row (the cache offsets), and the score_mod needs index arithmetic alone, no loads of positions.
    """

    block_mask: BlockMask
    query_positions: torch.Tensor  # (B, q) int64
    key_positions: torch.Tensor  # (B, kv) int64
    index_shift: torch.Tensor | None  # 0-dim int64, or None with padding


def alibi_flex_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int = 0,
    mask_function: Callable = causal_mask_function,
    attention_mask: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
    **kwargs,
) -> AlibiBlockMask:
    """Mask function for the flex ALiBi backend: the block mask (causal, padding) and the token positions.

    The block mask is built compiled on CUDA: uncompiled, ``create_block_mask`` materialises an n x n mask.

    Args:
        batch_size (`int`): rows ``B``.
        q_length (`int`): queries ``q`` of this call.
        kv_length (`int`): keys ``kv`` of this call.
        q_offset (`int` or `torch.Tensor`, defaults to 0): the cache index of the first query.
        kv_offset (`int`, defaults to 0): the cache index of the first key.
        mask_function (`Callable`, defaults to transformers' causal mask): which (query, key) pairs attend.
        attention_mask (`torch.Tensor`, *optional*): the 2D ``(B, length)`` padding mask.
        device (`torch.device` or `str`, defaults to ``"cpu"``): where the mask is made.
        **kwargs (`Any`): the mask interface's other arguments, not read.

    Returns:
        `AlibiBlockMask`: the block mask, the positions (:func:`token_positions`) and, without padding, the index
        shift.
    """
    padded = attention_mask is not None and not attention_mask.all()
    if padded:
        padding = prepare_padding_mask(attention_mask.to(device=device, dtype=torch.bool), kv_length, kv_offset)
        mask_function = and_masks(mask_function, padding_mask_function(padding))
    # Offsets as tensors: a compiled mask_mod that captured them as ints would recompile at every decoding
    # step, and past dynamo's recompile limit fall back to the uncompiled n x n path. Copies: a static cache
    # advances its own offset tensor in place before attention runs, and flex evaluates mask_mod in there.
    offsets = tuple(torch.as_tensor(offset, device=device).clone() for offset in (q_offset, kv_offset))
    build = _compiled_create_block_mask() if compiles_flex(device) else create_block_mask
    block_mask = build(
        mask_mod=add_offsets_to_mask_function(mask_function, *offsets),
        B=batch_size,
        H=None,
        Q_LEN=q_length,
        KV_LEN=kv_length,
        device=device,
    )
    queries, keys = token_positions(batch_size, q_length, kv_length, q_offset, kv_offset, attention_mask, device)
    return AlibiBlockMask(block_mask, queries, keys, None if padded else queries[0, 0] - keys[0, 0])


@dataclass
class AlibiPrefillMask:
    """What the cudnn backend gets as ``attention_mask``: whether the call is a plain causal prefill (what
    cuDNN's fused ALiBi computes), and the flex mask for every other call. That one is built with this object
    (its offsets may be tensors the cache updates in place before attention runs), or for a plain prefill on
    first use (where cuDNN turns the shape down; the offsets are then the int 0). All layers share it."""

    plain_causal: bool
    flex_arguments: dict[str, Any]
    built: AlibiBlockMask | None = None

    @property
    def flex(self) -> AlibiBlockMask:
        if self.built is None:
            self.built = alibi_flex_mask(**self.flex_arguments)
        return self.built


def alibi_prefill_mask(**arguments: Any) -> AlibiPrefillMask:
    """Mask function for the cudnn ALiBi backend (transformers passes every argument by keyword; those of
    :func:`alibi_flex_mask`)."""
    plain = _plain_causal(**arguments)
    return AlibiPrefillMask(plain, arguments, None if plain else alibi_flex_mask(**arguments))


def _plain_causal(
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int = 0,
    mask_function: Callable = causal_mask_function,
    attention_mask: torch.Tensor | None = None,
    **kwargs,
) -> bool:
    """Whether queries and keys are the same tokens from index 0 (no cache offset), the mask is transformers'
    causal mask alone (no sliding window, no packed sequences) and no token is padding: then positions equal
    indices, which is what cuDNN's bias uses."""
    return (
        mask_function is causal_mask_function
        and q_length == kv_length
        and not isinstance(q_offset, torch.Tensor)
        and q_offset == 0
        and kv_offset == 0
        and (attention_mask is None or bool(attention_mask.all()))
    )
