"""Attention for the remap methods (Self-Extend, DCA) and temperature scaling, with transformers'
attention-function signature.

The model hands over q and k rotated at their true positions. A remap's segment ``g`` wants the query at
``P_g(i)`` and the key at ``K_g(j)`` (:mod:`hf_posenc.methods.remap`); RoPE's ``R(a) R(b) = R(a + b)``
gets there by rotating q by ``P_g(i) - i`` and k by ``K_g(j) - j`` with the model's own (possibly scaled)
frequencies, so cached keys are re-rotated on the fly, never stored twice. Temperature scaling multiplies
each query by its position's factor first. Backends, all with one softmax over every segment's logits:

* ``eager``: the reference; float32 ``n x n`` logits of every segment, merged by segment, one softmax.
* ``blocked`` and ``sdpa`` (:mod:`~hf_posenc.attention.extension_blocks`): query blocks against the key range
  each segment can reach there; memory ``O(block * n)``.
* ``flex`` (:mod:`~hf_posenc.attention.extension_flex`): ``flex_attention`` with block masks that skip
  the pairs a segment does not hold; memory linear in ``n``.

Positions are token positions counted over the attention mask's non-padding tokens, as ``generate()``
assigns ``position_ids``; :func:`extension_mask` derives them, and the first layer checks that the
rotary embedding was given the same ones.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask
from transformers.masking_utils import causal_mask_function, prepare_padding_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..methods.remap import RemapParams
from ..methods.temperature import TemperatureParams


@dataclass(eq=False)
class ExtensionState:
    """What a patched attention module carries: the remap and temperature parameters (either may be None),
    the model's rotary module (read at call time: its frequencies are the ones q and k were rotated with) and
    how many leading dimensions of a head it rotates."""

    remap: RemapParams | None
    temperature: TemperatureParams | None
    rotary: nn.Module
    rotary_dim: int


@dataclass(eq=False)
class PositionMask:
    """What the extension backends get as ``attention_mask``: positions, not an ``n x n`` tensor.

    A query attends to a key when the key is not padding and its position is at most the query's; positions
    count non-padding tokens (both sorted along the sequence). All layers share one, so flex's block masks,
    built on first use, serve every layer.
    """

    query_positions: torch.Tensor  # (B, q) int64
    key_positions: torch.Tensor  # (B, kv) int64
    key_valid: torch.Tensor | None  # (B, kv) bool, None without padding
    query_valid: torch.Tensor | None = None  # (B, q) bool, None without padding
    block_masks: dict[Any, BlockMask] = field(default_factory=dict)  # (remap, ...) -> flex's, built on first use
    # (remap, "query" or "key", segment) -> the cos/sin turning those to its positions: one per call of the model
    rotations: dict[Any, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def allowed(self, queries: slice = slice(None), keys: slice = slice(None)) -> torch.Tensor:
        """``(B, 1, q, kv)`` bool for the given query rows and key columns."""
        allowed = self.key_positions[:, None, None, keys] <= self.query_positions[:, None, queries, None]
        if self.key_valid is not None:
            allowed = allowed & self.key_valid[:, None, None, keys]
        return allowed


def extension_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int = 0,
    mask_function: Any = causal_mask_function,
    attention_mask: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
    **kwargs: Any,
) -> PositionMask:
    """Mask function of every extension backend (transformers' mask-interface signature): positions, no ``n x n``
    tensor.

    Args:
        batch_size (`int`): rows ``B``.
        q_length (`int`): queries ``q`` of this call.
        kv_length (`int`): keys ``kv`` of this call.
        q_offset (`int` or `torch.Tensor`, defaults to 0): the cache index of the first query.
        kv_offset (`int`, defaults to 0): the cache index of the first key.
        mask_function (`Any`, defaults to transformers' causal mask): must be that one.
        attention_mask (`torch.Tensor`, *optional*): the 2D ``(B, length)`` padding mask.
        device (`torch.device` or `str`, defaults to ``"cpu"``): where the positions are made.
        **kwargs: the mask interface's other arguments, not read.

    Raises:
        ValueError: another ``mask_function`` (a sliding window, packed sequences, an added mask).
    """
    if mask_function is not causal_mask_function:
        raise ValueError(
            "The remaps (Self-Extend, DCA, STRING, ReRoPE) and log-n scaling support plain causal attention; this "
            "call asks for another mask (a sliding window, packed sequences in position_ids, or an added mask "
            "function)."
        )
    queries = torch.arange(q_length, device=device) + q_offset
    keys = torch.arange(kv_length, device=device) + kv_offset
    if attention_mask is None or bool(attention_mask.all()):
        # Without padding a position is its cache index (a mask shorter than the cache covers what is written).
        valid = None if attention_mask is None else _padding(attention_mask, kv_length, kv_offset, device)[:, keys]
        valid = None if valid is None or bool(valid.all()) else valid
        # contiguous, as with padding: compiled flex guards on strides, and would compile again for each layout
        rows = (queries.expand(batch_size, -1).contiguous(), keys.expand(batch_size, -1).contiguous())
        return PositionMask(*rows, valid)
    padding = _padding(attention_mask, kv_length, kv_offset, device)
    counts = padding.long().cumsum(-1) - 1  # position of each token = non-padding tokens before it
    return PositionMask(counts[:, queries], counts[:, keys], padding[:, keys], padding[:, queries])


def _padding(attention_mask: torch.Tensor, kv_length: int, kv_offset: int, device: Any) -> torch.Tensor:
    return prepare_padding_mask(attention_mask.to(device=device, dtype=torch.bool), kv_length, kv_offset)


def rotation(shift: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, float32 ``(B, 1, n, d)`` in transformers' half-split layout, of a rotation by ``shift``
    positions ``(B, n)``; angles in float64."""
    angles = shift.to(torch.float64)[:, None, :, None] * inv_freq.to(torch.float64)  # (B, 1, n, d/2)
    angles = torch.cat((angles, angles), -1)
    return angles.cos().float(), angles.sin().float()


def rotate(
    states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``(B, H, n, D)`` states turned by :func:`rotation`'s ``cos``, ``sin`` on their first ``rotary_dim``
    dimensions, computed in float32 and returned in ``dtype`` and the layout of ``states`` (a model's q and k
    are heads transposed out of ``(B, n, H, D)``: turned or not, they then take the same compiled flex). Each
    half is one product and one fused multiply-add on half-width float32 temporaries (half precision states
    widen in the product), written once into the result: this runs on every layer's q and k of a prefill.

    Args:
        states (`torch.Tensor`): ``(B, H, n, D)`` queries or keys.
        cos (`torch.Tensor`): :func:`rotation`'s cosines, ``(B, 1, n, rotary_dim)`` float32.
        sin (`torch.Tensor`): :func:`rotation`'s sines, the same shape.
        rotary_dim (`int`): the leading dimensions of a head that RoPE rotates; the rest are copied.
        dtype (`torch.dtype`, defaults to float32): dtype of the result.
    """
    half = rotary_dim // 2
    wide = states[..., :rotary_dim].float() if states.dtype == torch.float64 else states[..., :rotary_dim]
    first, second = wide[..., :half], wide[..., half:]
    cos, sin = cos[..., :half], sin[..., :half]  # the half-split layout repeats each half
    turned = torch.empty_like(states, dtype=dtype)
    turned[..., :half] = (first * cos).addcmul_(second, sin, value=-1)  # x1 cos - x2 sin
    turned[..., half:rotary_dim] = (second * cos).addcmul_(first, sin)  # x2 cos + x1 sin
    turned[..., rotary_dim:] = states[..., rotary_dim:]
    return turned


Turn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.dtype], torch.Tensor]
"""How a backend applies :func:`rotate` (on CUDA: compiled, one fused pass, where eager makes five)."""


@functools.cache
def torch_compiled(function: Any, dynamic: bool) -> Any:
    """``torch.compile(function, dynamic=dynamic)``, once per function and mode. Dynamic shapes on CUDA (one
    compilation for every length); static on a CPU, where inductor's C++ code for flex with dynamic shapes does not
    compile (torch 2.13): a compilation per length there."""
    return torch.compile(function, dynamic=dynamic)


def extension_state(module: nn.Module) -> ExtensionState:
    state = getattr(module, "hf_posenc_extension", None)
    if state is None:
        raise RuntimeError(
            f"{type(module).__name__} carries no hf_posenc extension: the hf_posenc_extension_* and hf_posenc_logn_* "
            "attention implementations serve models patched with hf_posenc.patch, not ones switched to them by hand."
        )
    return state


def checked_mask(module: nn.Module, mask: Any, kwargs: dict[str, Any]) -> PositionMask:
    """The mask, and on the first layer a check that the rotary embedding used these positions at every real
    (non-padding) query; padding queries are free (:func:`positions_over_mask` fills them in).

    Args:
        module (`nn.Module`): the attention module (its ``layer_idx``: 0 checks).
        mask (`Any`): the ``attention_mask`` the attention function got.
        kwargs (`dict[str, Any]`): the attention function's keyword arguments (``position_ids``).

    Raises:
        TypeError: ``mask`` is not a :class:`PositionMask` (a prepared 4D mask was passed).
        ValueError: ``position_ids`` differ from the mask's positions at a real query.
    """
    if not isinstance(mask, PositionMask):
        raise TypeError(
            f"The hf_posenc extension attention got an attention mask of type {type(mask).__name__}; pass a 2D "
            "(batch, length) attention_mask, not a prepared 4D mask."
        )
    position_ids = kwargs.get("position_ids")
    if getattr(module, "layer_idx", 0) == 0 and position_ids is not None:
        expected = mask.query_positions
        real = torch.ones_like(expected, dtype=torch.bool) if mask.query_valid is None else mask.query_valid
        if not bool(((position_ids.expand_as(expected) == expected) | ~real).all()):
            raise ValueError(POSITIONS_ERROR)
    return mask


POSITIONS_ERROR = (
    "position_ids must count the non-padding tokens (attention_mask.cumsum(-1) - 1, as generate() assigns them): "
    "the remaps and log-n read positions from the attention mask."
)


def positions_over_mask(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
    """Forward pre-hook of a patched decoder. With padding in a 2D ``attention_mask`` (covering the cache and the
    new tokens), a token's position is the count of non-padding tokens before it, what :func:`extension_mask`
    and log-n read. ``position_ids`` are made so where they are not given, as ``generate()`` makes them (padding,
    free, at 1), or where they are ``generate()``'s count from 1 (:func:`counts_real_tokens`): a padded forward
    gives each row its own logits, as the unpatched model does. Given ones that disagree at a real token otherwise
    raise: the rotary embedding would turn q and k by other distances than the method's.

    Args:
        module (`nn.Module`): the decoder.
        args (`tuple`): its forward's positional arguments.
        kwargs (`dict[str, Any]`): its forward's keyword arguments.

    Returns:
        `tuple[tuple, dict[str, Any]]` or `None`: the arguments with ``position_ids`` set, or None to leave them.

    Raises:
        ValueError: given ``position_ids`` that disagree with the count at a real token.
    """
    names = _forward_parameters(type(module))
    passed = {**dict(zip(names, args, strict=False)), **kwargs}
    mask, tokens = passed.get("attention_mask"), passed.get("input_ids")
    tokens = passed.get("inputs_embeds") if tokens is None else tokens
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or tokens is None or bool(mask.all()):
        return None  # without padding a position is its cache index, the model's default
    new = tokens.shape[1]
    real = mask[:, -new:].bool()
    counted = (mask.long().cumsum(-1) - 1)[:, -new:]
    given = passed.get("position_ids")
    if given is not None:
        given = given.expand_as(counted)
        if not counts_real_tokens(given, counted, real, left_padded=~mask[:, :1].bool()):
            raise ValueError(POSITIONS_ERROR)
        if bool(((given == counted) | ~real).all()):
            return None
    index = names.index("position_ids")
    if index < len(args):
        return (*args[:index], counted.masked_fill(~real, 1), *args[index + 1 :]), kwargs
    return args, {**kwargs, "position_ids": counted.masked_fill(~real, 1)}


def counts_real_tokens(
    given: torch.Tensor, counted: torch.Tensor, real: torch.Tensor, left_padded: torch.Tensor
) -> bool:
    """Whether ``given`` position_ids (B, q) of a padded batch equal the ``counted`` non-padding tokens at every
    ``real`` query (padding queries are free), or, in a row that starts with padding (``left_padded``, (B, 1)), the
    count plus one at every real query: ``generate()`` starts a row whose prompt is all padding at 1 (its padding at
    0, then one more a step), which the hook above replaces by the count. Any other offset is refused, as it may
    differ from the one the cached keys were turned with (a call sees only its own tokens).

    Args:
        given (`torch.Tensor`): the ``position_ids`` given, ``(B, q)``.
        counted (`torch.Tensor`): the non-padding tokens before each query, ``(B, q)``.
        real (`torch.Tensor`): which queries are real tokens, ``(B, q)`` bool.
        left_padded (`torch.Tensor`): which rows start with padding, ``(B, 1)`` bool.
    """
    offset = torch.where(real, given - counted, 0)
    return bool(((offset == 0) | ~real).all(-1).logical_or(((offset == 1) | ~real).all(-1) & left_padded[:, 0]).all())


@functools.cache
def _forward_parameters(decoder: type) -> list[str]:
    """The names of ``decoder.forward``'s parameters after ``self``, in order (read once per class: the hook runs
    at every forward, each step of ``generate()``)."""
    return list(inspect.signature(decoder.forward).parameters)[1:]


def scaled_queries(state: ExtensionState, query: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The queries times log-n's factor at their positions and the remap's :attr:`~RemapParams.query_scale`."""
    scale = 1.0 if state.remap is None else state.remap.query_scale
    if state.temperature is None:
        return query if scale == 1.0 else query * scale
    factor = state.temperature.scale(positions) * scale
    return query * factor[:, None, :, None].to(query.dtype)


def _rotation(state: ExtensionState, mask: PositionMask, side: str, segment: int) -> tuple[torch.Tensor, ...]:
    """The (cos, sin) turning the queries (``side="query"``) or keys (``"key"``) to segment ``segment``'s
    positions. They depend on the positions alone, so they are computed once per call of the model and kept on
    the mask for every layer."""
    remap = state.remap
    if (remap, side, segment) not in mask.rotations:
        if side == "query":
            positions = mask.query_positions
            shift = remap.query_position(segment, positions) - positions
        else:
            positions = mask.key_positions
            shift = remap.key_position(segment, positions) - positions
        mask.rotations[remap, side, segment] = rotation(shift, state.rotary.inv_freq)
    return mask.rotations[remap, side, segment]


def segment_queries(
    state: ExtensionState,
    mask: PositionMask,
    segment: int,
    query: torch.Tensor,
    rows: slice = slice(None),
    dtype: torch.dtype = torch.float32,
    turn: Turn = rotate,
) -> torch.Tensor:
    """q (the mask's query ``rows``) as segment ``segment`` sees it: as given where its distances are the true
    ones, else re-rotated (in ``dtype``).

    Args:
        state (`ExtensionState`): the module's remap and rotary embedding.
        mask (`PositionMask`): the call's positions (and the rotations kept on it).
        segment (`int`): the segment's index in the remap's ``SEGMENTS``.
        query (`torch.Tensor`): ``(B, H, rows, D)``, the queries of ``rows``.
        rows (`slice`, defaults to all): which of the mask's queries ``query`` holds.
        dtype (`torch.dtype`, defaults to float32): dtype of re-rotated queries.
        turn (`Turn`, defaults to ``rotate``): how the rotation is applied (:func:`rotate`, or it compiled).
    """
    if state.remap.TRUE_DISTANCES[segment]:
        return query
    cos, sin = _rotation(state, mask, "query", segment)
    return turn(query, cos[:, :, rows], sin[:, :, rows], state.rotary_dim, dtype)


def segment_keys(
    state: ExtensionState,
    mask: PositionMask,
    segment: int,
    key: torch.Tensor,
    dtype: torch.dtype = torch.float32,
    turn: Turn = rotate,
) -> torch.Tensor:
    """Every k as segment ``segment`` sees it, as :func:`segment_queries` does q.

    Args:
        state (`ExtensionState`): the module's remap and rotary embedding.
        mask (`PositionMask`): the call's positions (and the rotations kept on it).
        segment (`int`): the segment's index in the remap's ``SEGMENTS``.
        key (`torch.Tensor`): ``(B, H_kv, kv, D)``, every key of the call.
        dtype (`torch.dtype`, defaults to float32): dtype of re-rotated keys.
        turn (`Turn`, defaults to ``rotate``): how the rotation is applied (:func:`rotate`, or it compiled).
    """
    if state.remap.TRUE_DISTANCES[segment]:
        return key
    cos, sin = _rotation(state, mask, "key", segment)
    return turn(key, cos, sin, state.rotary_dim, dtype)


def segment_states(
    state: ExtensionState,
    mask: PositionMask,
    query: torch.Tensor,
    key: torch.Tensor,
    dtype: torch.dtype = torch.float32,
    turn: Turn = rotate,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Each segment's queries and keys as it sees them (:func:`segment_queries`, :func:`segment_keys`), in
    segment order; segments whose keys are turned alike (``key_source``) share one turn of the keys.

    Args:
        state (`ExtensionState`): the module's remap and rotary embedding.
        mask (`PositionMask`): the call's positions.
        query (`torch.Tensor`): ``(B, H, q, D)``, every query of the call.
        key (`torch.Tensor`): ``(B, H_kv, kv, D)``, every key of the call.
        dtype (`torch.dtype`, defaults to float32): dtype of re-rotated queries and keys.
        turn (`Turn`, defaults to ``rotate``): how the rotation is applied (:func:`rotate`, or it compiled).

    Yields:
        `tuple[torch.Tensor, torch.Tensor]`: a segment's queries and keys.
    """
    keys: dict[int, torch.Tensor] = {}
    for segment in range(len(state.remap.SEGMENTS)):
        source = state.remap.key_source(segment)
        if source not in keys:
            keys[source] = segment_keys(state, mask, source, key, dtype, turn)
        yield segment_queries(state, mask, segment, query, dtype=dtype, turn=turn), keys[source]


def grouped_scores(query: torch.Tensor, key: torch.Tensor, scaling: float) -> torch.Tensor:
    """``(B, H, q, D) x (B, H_kv, k, D) -> (B, H, q, k)`` float32 logits, each key head serving its query
    heads without copies.

    Args:
        query (`torch.Tensor`): ``(B, H, q, D)``.
        key (`torch.Tensor`): ``(B, H_kv, k, D)``; ``H`` a multiple of ``H_kv``.
        scaling (`float`): multiplies the logits.
    """
    batch, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    grouped = query.float().reshape(batch, kv_heads, heads // kv_heads * length, dim)
    scores = torch.matmul(grouped, key.float().transpose(-1, -2)) * scaling
    return scores.reshape(batch, heads, length, key.shape[2])


def grouped_output(weights: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``(B, H, q, k) x (B, H_kv, k, D) -> (B, q, H, D)``."""
    batch, heads, length, keys = weights.shape
    kv_heads = value.shape[1]
    grouped = weights.reshape(batch, kv_heads, heads // kv_heads * length, keys)
    output = torch.matmul(grouped.to(value.dtype), value).reshape(batch, heads, length, value.shape[-1])
    return output.transpose(1, 2).contiguous()


def masked_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis; a row with no allowed key (a padding query) gets weights 0, not NaN."""
    empty = torch.isneginf(scores).all(-1, keepdim=True)
    return torch.softmax(scores.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)


def prepared(
    module: nn.Module, query: torch.Tensor, attention_mask: Any, dropout: float, kwargs: dict[str, Any]
) -> tuple[ExtensionState, PositionMask, torch.Tensor]:
    """What every remap backend starts with: the module's state, the checked mask, the queries scaled by log-n.

    Args:
        module (`nn.Module`): the patched attention module.
        query (`torch.Tensor`): ``(B, H, q, D)``.
        attention_mask (`Any`): the mask the attention function got (a :class:`PositionMask`).
        dropout (`float`): the attention dropout asked for; must be 0 in training.
        kwargs (`dict[str, Any]`): the attention function's keyword arguments.

    Raises:
        RuntimeError: ``module`` carries no extension state (not patched by ``hf_posenc.patch``).
        TypeError: the mask is not a :class:`PositionMask`.
        ValueError: ``position_ids`` disagree with the mask (:func:`checked_mask`), or dropout in training.
    """
    state, mask = extension_state(module), checked_mask(module, attention_mask, kwargs)
    if dropout and module.training:
        raise ValueError("The hf_posenc extension attention has no attention dropout; set it to 0 to train.")
    return state, mask, scaled_queries(state, query, mask.query_positions)


def extension_eager_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: PositionMask,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: every segment's logits in float32, merged pair by pair, one softmax.

    Args:
        module (`nn.Module`): the patched attention module (its ``hf_posenc_extension`` state).
        query (`torch.Tensor`): ``(B, H, q, D)``, rotated at the true positions.
        key (`torch.Tensor`): ``(B, H_kv, kv, D)``, rotated at the true positions.
        value (`torch.Tensor`): ``(B, H_kv, kv, D)``.
        attention_mask (`PositionMask`): what :func:`extension_mask` made.
        scaling (`float`): the logits' scale.
        dropout (`float`, defaults to 0.0): must be 0 in training (no attention dropout).
        **kwargs: the model's other attention arguments; ``position_ids`` checked on the first layer.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: the output ``(B, q, H, D)`` and the weights ``(B, H, q, kv)``.

    Raises:
        ValueError: as :func:`prepared` refuses the call (which also raises ``RuntimeError`` and ``TypeError``).
    """
    state, mask, query = prepared(module, query, attention_mask, dropout, kwargs)
    qpos, kpos = mask.query_positions, mask.key_positions
    segment_of = state.remap.segment_of(qpos[:, None, :, None], kpos[:, None, None, :])  # (B, 1, q, kv)
    scores = None
    for segment, states in enumerate(segment_states(state, mask, query, key)):
        here = grouped_scores(*states, scaling)
        scores = here if scores is None else torch.where(segment_of == segment, here, scores)
    weights = masked_softmax(scores.masked_fill(~mask.allowed(), -torch.inf))
    return grouped_output(weights, value), weights


def temperature_attention(base: str) -> Any:
    """The attention function of ``hf_posenc_logn_<base>``: each query scaled by log-n's factor at its position
    (``position_ids``), then the model's own ``base`` implementation, unchanged."""

    def attention(module: nn.Module, query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        state, position_ids = extension_state(module), kwargs.get("position_ids")
        if position_ids is None:
            raise ValueError("log-n scaling needs the query positions; this model did not pass position_ids on.")
        if base == "eager":  # each model has its own eager function, beside its attention class
            function = sys.modules[type(module).__module__].eager_attention_forward
        else:
            function = ALL_ATTENTION_FUNCTIONS[base]
        return function(module, scaled_queries(state, query, position_ids), *args, **kwargs)

    return attention
