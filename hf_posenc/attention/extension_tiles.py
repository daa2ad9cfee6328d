"""The remaps' prefill as tiles: each segment a few causal or full attention calls of a fused kernel, merged by
log-sum-exp. What the ``sdpa`` backend runs on a prefill, left-padded or not, where it applies (:func:`tile_starts`).

A segment's pairs in a prefill of positions ``0 .. n-1`` are a handful of rectangles
(:meth:`~hf_posenc.methods.remap.RemapParams.tiles`): Self-Extend's grouped pairs one causal square shifted by
``W``, its neighbour band causal squares and strict upper triangles, DCA's chunks causal squares and full
rectangles. A kernel that computes causal attention skips the upper half of a square; a strict upper triangle
is a causal square with rows and columns reversed, less its diagonal. Equal tiles go in one call, stacked along
the batch. Each call returns its output and the log-sum-exp of its logits; a running merge, in float32, weights
them into one softmax over all of a query's keys. Memory is linear in ``n``, and no call computes a pair twice.
In a left-padded batch the rows padded alike are one prefill of their tokens.

The kernels are PyTorch's own, called for their log-sum-exp: flash attention on a CPU; on CUDA the one
``scaled_dot_product_attention`` dispatches each call to (cuDNN on Hopper, flash attention in half precision on
Ampere, memory-efficient attention otherwise), so that each tile runs the kernel plain causal SDPA runs.
PyTorch's context parallelism merges these ops' outputs by their log-sum-exp in the same way. Their log-sum-exp
carries no gradient, so a call that needs one takes the query blocks instead.
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch.nn.attention import SDPBackend

from ..methods.remap import Tiles
from .extension import ExtensionState, PositionMask, rotate, segment_keys, segment_queries, torch_compiled


def tile_starts(mask: PositionMask, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> list[int] | None:
    """Where each row's tokens start if this call is a prefill the tiles serve (:func:`prefill_starts`), with no
    gradient to carry and a kernel that takes the inputs (:func:`_kernel_takes`); else ``None``.

    Args:
        mask (`PositionMask`): the call's positions.
        query (`torch.Tensor`): ``(B, H, q, D)``.
        key (`torch.Tensor`): ``(B, H_kv, kv, D)``.
        value (`torch.Tensor`): ``(B, H_kv, kv, D)``.
    """
    length = query.shape[2]
    if length > key.shape[2] or not _kernel_takes(query, value):
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        return None
    return prefill_starts(mask, length)


def prefill_starts(mask: PositionMask, length: int) -> list[int] | None:
    """Where each row's tokens start in a prefill of ``length`` queries the tiles serve, else ``None``: every row
    padded on the left at most, its tokens at positions ``0, 1, ...`` from there (nothing cached before), and the
    first ``length`` keys the queries' own (a static cache's later slots are never seen)."""
    queries, keys = mask.query_positions, mask.key_positions[:, :length]
    valid = mask.query_valid if mask.query_valid is not None else torch.ones_like(queries, dtype=torch.bool)
    key_valid = mask.key_valid[:, :length] if mask.key_valid is not None else torch.ones_like(valid)
    starts = length - valid.sum(1)  # (B,): with left padding a row's tokens are the last ones
    first = queries.gather(1, starts.clamp(max=length - 1)[:, None])[:, 0]
    left_padded = valid[:, 1:].ge(valid[:, :-1]).all()
    own = queries.eq(keys).all() & key_valid.eq(valid).all()
    if not bool(left_padded & own & (first.eq(0) | starts.eq(length)).all()):
        return None
    return starts.tolist()


def _kernel_takes(query: torch.Tensor, value: torch.Tensor) -> bool:
    """Values as wide as the queries, on a CPU or on CUDA where ``scaled_dot_product_attention`` would run a fused
    kernel for a causal call of this shape and dtype (:func:`_kernel`); and that kernel's op as this module calls
    it (:func:`_op_as_called`). On CUDA the head dimension must be a multiple of 8: SDPA pads it to one before it
    calls flash attention's op, which refuses any other, and these calls do not pad."""
    dim = query.shape[-1]
    if value.shape[-1] != dim or query.device.type not in ("cpu", "cuda") or (query.is_cuda and dim % 8):
        return False
    name = _kernel(query, query, query, True)
    return name is not None and _op_as_called(OPS[name])


# What each kernel passes by position and reads of what it returns, as PyTorch 2.13 and 2.14 name them. The ops are
# private: a release that renames or reorders these makes the tiles step aside rather than call the op wrongly.
_FLASH = (("query", "key", "value", "dropout_p", "is_causal"), ("output", "logsumexp"))
_WITH_BIAS = ("query", "key", "value", "attn_bias", "compute_log_sumexp", "dropout_p", "is_causal")
CALLED = {
    "_scaled_dot_product_flash_attention_for_cpu": _FLASH,
    "_scaled_dot_product_flash_attention": _FLASH,
    "_scaled_dot_product_efficient_attention": (_WITH_BIAS, ("output", "log_sumexp")),
    "_scaled_dot_product_cudnn_attention": (_WITH_BIAS, ("output", "logsumexp")),
}


@functools.cache
def _op_as_called(name: str) -> bool:
    """Whether ``torch.ops.aten.<name>`` exists with the leading arguments, a ``scale`` keyword and the first
    outputs :data:`CALLED` says; if not, a warning (once) that the prefill takes the slower query blocks."""
    try:
        schema = getattr(torch.ops.aten, name).default._schema
    except (AttributeError, RuntimeError):
        schema = None
    arguments = [argument.name for argument in schema.arguments] if schema else []
    returns = [output.name for output in schema.returns] if schema else []
    passed, read = CALLED[name]
    if arguments[: len(passed)] == list(passed) and "scale" in arguments and returns[: len(read)] == list(read):
        return True
    warnings.warn(
        f"PyTorch {torch.__version__}'s torch.ops.aten.{name} is not the op hf_posenc calls (arguments "
        f"{arguments or 'none'}, outputs {returns or 'none'}): the remaps' prefills run as query blocks, "
        "slower but the same numbers.",
        stacklevel=2,
    )
    return False


def cpu_kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, causal: bool, scale: float):
    """PyTorch's flash attention on a CPU: ``(B, H, n, D)`` output and ``(B, H, n)`` float32 log-sum-exp
    (``causal``: key ``b`` of a square seen by queries ``a >= b``).

    Args:
        query (`torch.Tensor`): ``(B, H, n, D)``.
        key (`torch.Tensor`): ``(B, H, m, D)``, as many heads as ``query``.
        value (`torch.Tensor`): ``(B, H, m, D)``.
        causal (`bool`): the tile is a causal square; otherwise every pair attends.
        scale (`float`): the logits' scale.
    """
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, causal, scale=scale)


def cuda_flash_kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, causal: bool, scale: float):
    """:func:`cpu_kernel` on CUDA with flash attention (half precision, Ampere or later).

    Args:
        query (`torch.Tensor`): ``(B, H, n, D)``.
        key (`torch.Tensor`): ``(B, H, m, D)``, as many heads as ``query``.
        value (`torch.Tensor`): ``(B, H, m, D)``.
        causal (`bool`): the tile is a causal square; otherwise every pair attends.
        scale (`float`): the logits' scale.
    """
    output, lse = torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, 0.0, causal, scale=scale)[:2]
    return output, lse


def cuda_efficient_kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, causal: bool, scale: float):
    """:func:`cpu_kernel` on CUDA with memory-efficient attention (its log-sum-exp padded to a multiple of 32 rows
    there, cut to ``n`` here).

    Args:
        query (`torch.Tensor`): ``(B, H, n, D)``.
        key (`torch.Tensor`): ``(B, H, m, D)``, as many heads as ``query``.
        value (`torch.Tensor`): ``(B, H, m, D)``.
        causal (`bool`): the tile is a causal square; otherwise every pair attends.
        scale (`float`): the logits' scale.
    """
    output, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, None, True, 0.0, causal, scale=scale
    )[:2]
    return output, lse[..., : query.shape[2]]


def cuda_cudnn_kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, causal: bool, scale: float):
    """:func:`cpu_kernel` on CUDA with cuDNN's fused attention (its log-sum-exp ``(B, H, n, 1)``, reshaped to
    ``(B, H, n)`` here).

    Args:
        query (`torch.Tensor`): ``(B, H, n, D)``.
        key (`torch.Tensor`): ``(B, H, m, D)``, as many heads as ``query``.
        value (`torch.Tensor`): ``(B, H, m, D)``.
        causal (`bool`): the tile is a causal square; otherwise every pair attends.
        scale (`float`): the logits' scale.
    """
    output, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        query, key, value, None, True, 0.0, causal, scale=scale
    )[:2]
    return output, lse.reshape(query.shape[:3])


OPS = {  # each kernel's op
    "cpu_kernel": "_scaled_dot_product_flash_attention_for_cpu",
    "cuda_flash_kernel": "_scaled_dot_product_flash_attention",
    "cuda_efficient_kernel": "_scaled_dot_product_efficient_attention",
    "cuda_cudnn_kernel": "_scaled_dot_product_cudnn_attention",
}
# The CUDA kernel of each backend torch._fused_sdp_choice names (torch.nn.attention.SDPBackend's values).
CUDA_KERNELS = {
    SDPBackend.FLASH_ATTENTION.value: "cuda_flash_kernel",
    SDPBackend.EFFICIENT_ATTENTION.value: "cuda_efficient_kernel",
    SDPBackend.CUDNN_ATTENTION.value: "cuda_cudnn_kernel",
}


def _kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, causal: bool) -> str | None:
    """The kernel for one call, by name: :func:`cpu_kernel` on a CPU; on CUDA the fused kernel that
    ``scaled_dot_product_attention`` would dispatch the same call to (cuDNN on Hopper, flash attention in half
    precision on Ampere, memory-efficient attention otherwise, as ``torch.nn.attention.sdpa_kernel`` allows).
    ``None`` where it would run the math fallback, which gives no log-sum-exp, or none (``sdpa_kernel`` ruling
    out every kernel that takes the call)."""
    if not query.is_cuda:
        return "cpu_kernel"
    try:
        return CUDA_KERNELS.get(torch._fused_sdp_choice(query, key, value, is_causal=causal))
    except RuntimeError:  # "No viable backend for scaled_dot_product_attention was found"
        return None


def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, causal: bool, scale: float):
    """One call of :func:`_kernel`'s kernel for this tile (looked up by name when called). The whole prefill's
    shape passed :func:`_kernel_takes`; a tile whose lengths the chosen kernel does not take goes to
    memory-efficient attention, which takes any."""
    name = _kernel(query, key, value, causal) or "cuda_efficient_kernel"
    return globals()[name](query, key, value, causal, scale)


def _stacked(states: torch.Tensor, start: int, size: int, count: int) -> torch.Tensor:
    """``count`` consecutive blocks of ``size`` positions from ``start`` of ``(B, H, n, D)`` states, stacked along
    the batch: ``(count * B, H, size, D)`` (one block: a view)."""
    if count == 1:
        return states[:, :, start : start + size]
    batch, heads, _, dim = states.shape
    blocks = states[:, :, start : start + count * size].reshape(batch, heads, count, size, dim)
    return blocks.permute(2, 0, 1, 3, 4).reshape(count * batch, heads, size, dim)


def _unstacked(states: torch.Tensor, batch: int) -> torch.Tensor:
    """:func:`_stacked`'s inverse: ``(count * B, H, rows, ...)`` -> ``(B, H, count, rows, ...)``."""
    return states.reshape(-1, batch, *states.shape[1:]).movedim(0, 2)


def _tile(tile: Tiles, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float):
    """One :class:`Tiles` call: ``(B, H, count, rows_out, D)`` output and ``(B, H, count, rows_out)`` log-sum-exp
    for the first ``rows_out`` rows of each tile (all of them; an upper triangle's last row holds no pair)."""
    batch = query.shape[0]
    q = _stacked(query, tile.query_start, tile.rows, tile.count)
    k, v = (_stacked(states, tile.key_start, tile.cols, tile.count) for states in (key, value))
    if tile.shape == "upper":  # b > a reversed is b' < a': the causal square of rows 1.. against columns ..-2
        q, k, v = q.flip(2)[:, :, 1:], k.flip(2)[:, :, :-1], v.flip(2)[:, :, :-1]
        output, lse = _attend(q, k, v, True, scale)
        output, lse = output.flip(2), lse.flip(2)
    else:
        output, lse = _attend(q, k, v, tile.shape == "lower", scale)
    return _unstacked(output, batch), _unstacked(lse, batch)


def _merge(total: torch.Tensor, total_lse: torch.Tensor, seen: torch.Tensor, output: torch.Tensor, lse: torch.Tensor):
    """Fold one call's ``output`` and ``lse`` into the running ``total`` and ``total_lse`` (float32, float64 for a
    float64 model; views of the rows it covers, 0 and -inf where no call has reached them), in place: both become
    the softmax over the keys of both. ``seen`` (``(count, rows)`` bool, on the CPU) marks the rows an earlier call
    reached. A call reaching none of them is copied; otherwise it is a ``lerp`` by its share of the softmax,
    ``exp(lse - merged)``, as the two shares add up to 1: one pass over the running output, which is memory-bound
    on a GPU, where scaling, widening, weighting and adding would take four."""
    if not seen.any():
        total.copy_(output)
        total_lse.copy_(lse)
    else:
        merged = torch.logaddexp(total_lse, lse.to(total.dtype))
        total.lerp_(output.to(total.dtype), torch.exp(lse - merged)[..., None])
        total_lse.copy_(merged)
    seen.fill_(True)


def _rows(states: torch.Tensor, tile: Tiles, rows: int) -> torch.Tensor:
    """The view of ``(B, H, n, ...)`` states ``(B, H, count, rows, ...)`` at the first ``rows`` rows of each tile."""
    span = states[:, :, tile.query_start : tile.query_start + tile.count * tile.rows]
    return span.unflatten(2, (tile.count, tile.rows))[:, :, :, :rows]


def _repeated(states: torch.Tensor, repeat: int) -> torch.Tensor:
    return states.repeat_interleave(repeat, 1) if repeat > 1 else states


def tiled_attention(
    state: ExtensionState,
    mask: PositionMask,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float,
    starts: list[int] | None = None,
) -> torch.Tensor:
    """Self-Extend / DCA on a prefill (:func:`tile_starts`) as tiles: ``(B, n, H, D)`` in the values' dtype. Rows with
    the same left padding (``starts``, from :func:`tile_starts`; none: no padding) are one prefill of their
    tokens; a padding query gets 0. Segments without a pair here (DCA's far chunks in an input shorter than a
    chunk) turn nothing.

    Args:
        state (`ExtensionState`): the module's remap and rotary embedding.
        mask (`PositionMask`): the call's positions.
        query (`torch.Tensor`): ``(B, H, n, D)``, rotated at the true positions (scaled by log-n where it applies).
        key (`torch.Tensor`): ``(B, H_kv, kv, D)``, rotated at the true positions; the first ``n`` are read.
        value (`torch.Tensor`): ``(B, H_kv, kv, D)``.
        scaling (`float`): the logits' scale.
        starts (`list[int]`, *optional*): where each row's tokens start, from :func:`tile_starts`.
    """
    batch, heads, length, _ = query.shape
    repeat = heads // key.shape[1]  # the kernels want as many key heads as query heads
    value = _repeated(value[:, :, :length], repeat)
    groups = _rows_by_start(starts or [0] * batch, length, query.device)
    turn = torch_compiled(rotate, True) if query.is_cuda else rotate  # as flex turns them there
    keys: dict[int, torch.Tensor] = {}  # each turn of the keys, repeated (by key_source: segments share one)
    merged = torch.promote_types(value.dtype, torch.float32)
    totals = {  # each group's running output and log-sum-exp, and which of its rows a call has reached (CPU)
        start: (
            query.new_zeros(len(rows), heads, length - start, value.shape[-1], dtype=merged),
            query.new_full((len(rows), heads, length - start), -torch.inf, dtype=merged),
            torch.zeros(1, 1, length - start, dtype=torch.bool),
        )
        for start, rows in groups.items()
    }
    for segment in range(len(state.remap.SEGMENTS)):
        tiles = {start: state.remap.tiles(segment, length - start) for start in groups}
        if not any(tiles.values()):
            continue
        source = state.remap.key_source(segment)
        if source not in keys:
            turned = segment_keys(state, mask, source, key, query.dtype, turn)[:, :, :length]
            keys[source] = _repeated(turned, repeat)
        seg_query = segment_queries(state, mask, segment, query, dtype=query.dtype, turn=turn)
        for start, rows in groups.items():
            q, k, v = (_group(states, rows, start, batch) for states in (seg_query, keys[source], value))
            for tile in tiles[start]:
                output, lse = _tile(tile, q, k, v, scaling)
                total, total_lse, seen = (_rows(states, tile, output.shape[3]) for states in totals[start])
                _merge(total, total_lse, seen[0, 0], output, lse)
    if 0 in groups and len(groups[0]) == batch:  # no padding: one group of every row, written out in one pass
        result = value.new_empty(batch, length, heads, value.shape[-1])
        result.transpose(1, 2).copy_(totals[0][0])
        return result
    result = value.new_zeros(batch, length, heads, value.shape[-1])
    for start, rows in groups.items():
        result[rows, start:] = totals[start][0].to(value.dtype).transpose(1, 2)
    return result


def _rows_by_start(starts: list[int], length: int, device: torch.device) -> dict[int, torch.Tensor]:
    """The rows (indices) whose tokens start at each position; rows of padding alone left out."""
    groups: dict[int, list[int]] = {}
    for row, start in enumerate(starts):
        if start < length:
            groups.setdefault(start, []).append(row)
    return {start: torch.tensor(rows, device=device) for start, rows in groups.items()}


def _group(states: torch.Tensor, rows: torch.Tensor, start: int, batch: int) -> torch.Tensor:
    """``(B, H, n, D)`` states of ``rows`` from position ``start``: a view where the rows are every row."""
    if len(rows) == batch:
        return states[:, :, start:]
    return states[rows, :, start:]
