"""ALiBi attention functions with transformers' attention-function signature, one per backend.

Each receives what the model's attention module passes to any attention implementation: ``module``,
``query (B, H, q, D)``, ``key``/``value (B, H_kv, kv, D)``, the mask built by the matching function of
:mod:`hf_posenc.attention.masks`, ``scaling`` and ``dropout``. The slopes are the patched attention
module's ``alibi_slopes`` (one per query head: with grouped-query attention they follow the
query heads). Press et al. 2022, §3: ``softmax(q_i K^T * scaling - m_h * (i - j))``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.nn.attention.flex_attention import flex_attention

from ..methods.alibi import alibi_slopes
from . import cudnn, masks
from .compiled_flex import compiled_flex
from .masks import AlibiBlockMask, AlibiPrefillMask, alibi_distance_mask


def _repeat_kv(states: torch.Tensor, groups: int) -> torch.Tensor:
    """``(B, H_kv, n, D)`` -> ``(B, H_kv * groups, n, D)``: each key/value head serves ``groups`` query heads."""
    return states if groups == 1 else states.repeat_interleave(groups, dim=1)


def _check_mask(attention_mask: Any, expected: type, backend: str) -> None:
    """``backend``: the method and backend, ``"ALiBi eager"``."""
    if not isinstance(attention_mask, expected):
        raise TypeError(
            f"The {backend} attention got an attention mask of type {type(attention_mask).__name__}; it needs "
            f"the {expected.__name__} its mask function builds from a 2D attention mask. Pass a 2D (batch, length) "
            "attention_mask, not a prepared 4D mask."
        )


def _no_dropout(module: nn.Module, dropout: float, backend: str) -> None:
    if dropout and module.training:
        raise ValueError(f"The {backend} backend has no attention dropout; use backend='sdpa' or set it to 0.")


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


BiasOf = Callable[[nn.Module, torch.Tensor], torch.Tensor]  # (module, (B, 1, q, kv) distance mask) -> (B, H, q, kv)
ScoreBias = Callable[[nn.Module, torch.device], Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]


def eager_bias_attention(bias_of: BiasOf, name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The reference backend of a bias method: scores, bias (``bias_of(module, distance mask)``, float32, ``-inf``
    where masked) and softmax in float32, the full ``(B, H, q, kv)`` bias materialised."""

    def attention(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor,
        scaling: float,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _check_mask(attention_mask, torch.Tensor, f"{name} eager")
        groups = query.shape[1] // key.shape[1]
        key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
        scores = torch.matmul(query.float(), key.float().transpose(2, 3)) * scaling  # (B, H, q, kv)
        weights = torch.softmax(scores + bias_of(module, attention_mask), dim=-1).to(value.dtype)
        weights = nn.functional.dropout(weights, p=dropout, training=module.training)
        output = torch.matmul(weights, value).transpose(1, 2).contiguous()  # (B, q, H, D)
        return output, weights

    return attention


def sdpa_bias_attention(bias_of: BiasOf, name: str) -> Callable[..., tuple[torch.Tensor, None]]:
    """``scaled_dot_product_attention`` with the bias as a float mask built per call (O(n^2) memory)."""

    def attention(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor,
        scaling: float,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        _check_mask(attention_mask, torch.Tensor, f"{name} sdpa")
        groups = query.shape[1] // key.shape[1]
        key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
        bias = bias_of(module, attention_mask).to(query.dtype)  # (B, H, q, kv)
        output = nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=bias, dropout_p=dropout if module.training else 0.0, scale=scaling
        )
        return output.transpose(1, 2).contiguous(), None  # (B, q, H, D)

    return attention


def flex_bias_attention(score_bias: ScoreBias, name: str) -> Callable[..., tuple[torch.Tensor, None]]:
    """``flex_attention`` with a score_mod adding ``score_bias(module, device)(i - j, head)``: the bias is computed
    per block, memory O(n). Compiled on CUDA (:mod:`hf_posenc.attention.compiled_flex`); on CPU it runs
    uncompiled, as a small-size check. ``i - j`` from the token positions (with padding), else from the indices
    and the cache offsets (``index_shift``: no loads of positions)."""

    def attention(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: AlibiBlockMask,
        scaling: float,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        _check_mask(attention_mask, AlibiBlockMask, f"{name} flex")
        _no_dropout(module, dropout, f"{name} flex")
        bias = score_bias(module, query.device)
        queries, keys, shift = attention_mask.query_positions, attention_mask.key_positions, attention_mask.index_shift

        def score_mod(score, batch, head, q_idx, kv_idx):
            return score + bias(queries[batch, q_idx] - keys[batch, kv_idx], head)

        # The shift (the cache offsets) is a per-row constant; it keeps the values exact distances.
        def index_score_mod(score, batch, head, q_idx, kv_idx):
            return score + bias(q_idx - kv_idx + shift, head)

        flex = dict(
            score_mod=score_mod if shift is None else index_score_mod,
            block_mask=attention_mask.block_mask,
            scale=scaling,
            enable_gqa=query.shape[1] != key.shape[1],
        )
        if masks.compiles_flex(query.device):
            label = f"{name} {'positions' if shift is None else 'indices'}"
            output = compiled_flex(label, query, key, value, **flex)
        else:
            output = flex_attention(query, key, value, **flex)
        return output.transpose(1, 2).contiguous(), None  # (B, q, H, D)

    return attention


def _alibi_score_bias(module: nn.Module, device: torch.device) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    slopes = slopes_on(module, device)
    return lambda distance, head: -slopes[head] * distance  # -m_h * (i - j)


alibi_eager_attention = eager_bias_attention(alibi_bias, "ALiBi")
alibi_sdpa_attention = sdpa_bias_attention(alibi_bias, "ALiBi")
alibi_flex_attention = flex_bias_attention(_alibi_score_bias, "ALiBi")


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
    _check_mask(attention_mask, AlibiPrefillMask, "ALiBi cudnn")
    _no_dropout(module, dropout, "ALiBi cudnn")
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
