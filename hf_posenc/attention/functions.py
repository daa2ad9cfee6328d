"""ALiBi attention functions with transformers' attention-function signature, one per backend.

Each receives what the model's attention module passes to any attention implementation: ``module``,
``query (B, H, q, D)``, ``key``/``value (B, H_kv, kv, D)``, the mask built by the matching function of
:mod:`hf_posenc.attention.masks`, ``scaling`` and ``dropout``. The slopes are the patched attention
module's ``alibi_slopes`` (one per query head: with grouped-query attention they follow the
query heads). Press et al. 2022, §3: ``softmax(q_i K^T * scaling - m_h * (i - j))``.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.nn.attention.flex_attention import flex_attention

from ..methods.alibi import alibi_slopes
from . import cudnn, masks
from .masks import AlibiBlockMask, AlibiPrefillMask, alibi_distance_mask


def _repeat_kv(states: torch.Tensor, groups: int) -> torch.Tensor:
    """``(B, H_kv, n, D)`` -> ``(B, H_kv * groups, n, D)``: each key/value head serves ``groups`` query heads."""
    return states if groups == 1 else states.repeat_interleave(groups, dim=1)


def _check_mask(attention_mask: Any, expected: type, backend: str) -> None:
    if not isinstance(attention_mask, expected):
        raise TypeError(
            f"The ALiBi {backend} attention got an attention mask of type {type(attention_mask).__name__}; it needs "
            f"the {expected.__name__} its mask function builds from a 2D attention mask. Pass a 2D (batch, length) "
            "attention_mask, not a prepared 4D mask."
        )


def _no_dropout(module: nn.Module, dropout: float, backend: str) -> None:
    if dropout and module.training:
        raise ValueError(f"The ALiBi {backend} backend has no attention dropout; use backend='sdpa' or set it to 0.")


def slopes_on(module: nn.Module, device: torch.device) -> torch.Tensor:
    """The module's float32 slopes on ``device``; moved there once (a plain attribute, not a buffer, so that
    ``model.to(dtype)`` cannot round them)."""
    if not hasattr(module, "alibi_slopes"):
        raise RuntimeError(
            f"{type(module).__name__} has no ALiBi slopes: the hf_posenc_alibi_* attention implementations serve "
            "models patched with hf_posenc.patch(model, 'alibi'), not ones switched to them by hand."
        )
    if module.alibi_slopes.device != device:
        module.alibi_slopes = module.alibi_slopes.to(device)
    return module.alibi_slopes


def alibi_bias(module: nn.Module, distance: torch.Tensor) -> torch.Tensor:
    """``(B, 1, q, kv)`` negative distances -> ``(B, H, q, kv)`` float32 bias ``-m_h * (i - j)``."""
    return distance * slopes_on(module, distance.device)[None, :, None, None]


def alibi_eager_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: scores and softmax in float32, the full ``(B, H, q, kv)`` bias materialised."""
    _check_mask(attention_mask, torch.Tensor, "eager")
    groups = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    scores = torch.matmul(query.float(), key.float().transpose(2, 3)) * scaling  # (B, H, q, kv)
    weights = torch.softmax(scores + alibi_bias(module, attention_mask), dim=-1).to(value.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()  # (B, q, H, D)
    return output, weights


def alibi_sdpa_attention(
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
    _check_mask(attention_mask, torch.Tensor, "sdpa")
    groups = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    bias = alibi_bias(module, attention_mask).to(query.dtype)  # (B, H, q, kv)
    output = nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=bias, dropout_p=dropout if module.training else 0.0, scale=scaling
    )
    return output.transpose(1, 2).contiguous(), None  # (B, q, H, D)


@functools.cache
def _compiled_flex_attention():
    return torch.compile(flex_attention, dynamic=True)


def alibi_flex_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: AlibiBlockMask,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``flex_attention`` with an ALiBi score_mod: the bias is computed per block, memory O(n).

    Compiled (one compilation, dynamic shapes) on CUDA; on CPU it runs uncompiled, as a small-size check.
    """
    _check_mask(attention_mask, AlibiBlockMask, "flex")
    _no_dropout(module, dropout, "flex")
    slopes = slopes_on(module, query.device)
    queries, keys, shift = attention_mask.query_positions, attention_mask.key_positions, attention_mask.index_shift

    def score_mod(score, batch, head, q_idx, kv_idx):  # -m_h * (i - j), positions looked up
        return score + slopes[head] * (keys[batch, kv_idx] - queries[batch, q_idx])

    # Without padding the same from the indices. The shift (the cache offsets) is a per-row constant, which
    # softmax ignores, but it keeps the float32 values exact distances, near zero where the weight is.
    def index_score_mod(score, batch, head, q_idx, kv_idx):
        return score + slopes[head] * (kv_idx - q_idx - shift)

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


def alibi_cudnn_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: AlibiPrefillMask,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """cuDNN's fused ALiBi kernel for a plain causal prefill (:mod:`hf_posenc.attention.cudnn`), the flex
    backend for every other call (padding, a KV cache, a shape cuDNN refuses)."""
    _check_mask(attention_mask, AlibiPrefillMask, "cudnn")
    _no_dropout(module, dropout, "cudnn")
    if (
        attention_mask.plain_causal
        and _fused_serves(module, query, key)
        and cudnn.prepare(query, key, value, scaling, training=cudnn.needs_grad(query, key, value))
    ):
        output = cudnn.fused_alibi_attention(query, key, value, scaling)  # (B, H, q, D), (B, q, H, D) in memory
        return output.transpose(1, 2), None  # (B, q, H, D), contiguous
    return alibi_flex_attention(module, query, key, value, attention_mask.flex, scaling, dropout, **kwargs)


def fused_problem(paper_slopes: bool, device: torch.device, heads: int, kv_heads: int, head_dim: int) -> str | None:
    """Why cuDNN's fused ALiBi cannot serve attention with these slopes and head counts on ``device``, or None:
    it computes the paper's slopes itself, and must pass :func:`cudnn_self_check` there (cached)."""
    if not paper_slopes:
        return "cuDNN computes the paper's slopes itself, and these slopes differ"
    return cudnn_self_check(device, heads, kv_heads, head_dim)


def _fused_serves(module: nn.Module, query: torch.Tensor, key: torch.Tensor) -> bool:
    """The check ``patch`` makes before choosing cudnn, again for a model switched to it afterwards
    (``set_attn_implementation``)."""
    paper_slopes = getattr(module, "alibi_paper_slopes", False)
    return fused_problem(paper_slopes, query.device, query.shape[1], key.shape[1], query.shape[3]) is None


def paper_alibi_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
    """The eager reference on a causal prefill without padding, with the paper's slopes for ``query``'s head
    count: what the fused cuDNN kernel must compute. ``(B, H, n, D)`` inputs, ``(B, n, H, D)`` output."""
    module = SimpleNamespace(alibi_slopes=alibi_slopes(query.shape[1], dtype=torch.float32), training=False)
    batch, length = query.shape[0], query.shape[2]
    mask = alibi_distance_mask(batch_size=batch, q_length=length, kv_length=length, device=query.device)
    return alibi_eager_attention(module, query, key, value, mask, scale)[0]


@functools.cache
def cudnn_self_check(device: torch.device, heads: int, kv_heads: int, head_dim: int) -> str | None:
    """Why the fused cuDNN kernel cannot serve attention of this shape on ``device``, or ``None``: a GPU where
    it runs and agrees with :func:`paper_alibi_attention` computed in float32 (256 tokens, bfloat16, forward)."""
    if device.type != "cuda":
        return f"it needs a CUDA device (this is {device.type})"
    if not cudnn.installed():
        return "the cuDNN frontend is not installed (pip install 'hf-posenc[cudnn]')"
    generator = torch.Generator(device).manual_seed(0)

    def rows(n_heads: int) -> torch.Tensor:
        shape = (1, 256, n_heads, head_dim)  # (B, T, H, D), as attention modules lay them out
        return torch.randn(shape, generator=generator, device=device, dtype=torch.bfloat16).transpose(1, 2)

    query, key, value = rows(heads), rows(kv_heads), rows(kv_heads)
    scale = head_dim**-0.5
    try:
        if not cudnn.prepare(query, key, value, scale, training=False):
            return f"cuDNN does not support {heads} query heads, {kv_heads} key/value heads, head dim {head_dim}"
        output = cudnn.fused_alibi_attention(query, key, value, scale).transpose(1, 2)  # (B, T, H, D)
    except Exception as error:  # a probe: any failure of the optional kernel is its answer
        return f"the fused kernel failed: {type(error).__name__}: {error}"
    expected = paper_alibi_attention(query.float(), key.float(), value.float(), scale)
    error = (output.float() - expected).abs().max().item()
    return None if error <= 2e-2 else f"the fused kernel differs from the paper's formula by {error:.3g}"
