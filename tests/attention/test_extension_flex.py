"""Both strategies of the remaps' flex backend (CUDA's per-segment calls merged by log-sum-exp, and the CPU's
segments side by side) against the eager reference, on random q, k, v with padding, uncompiled on the CPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers import gpu

from hf_posenc.attention import extension_flex
from hf_posenc.attention.extension import (
    ExtensionState,
    extension_eager_attention,
    extension_mask,
    scaled_queries,
)
from hf_posenc.attention.extension_flex import extension_flex_attention
from hf_posenc.registry import get_method

HEADS, KV_HEADS, DIM, LENGTH = 4, 2, 16, 80
CASES = {
    "self-extend": {"group_size": 4, "window": 8},
    "dca": {"chunk_size": 24, "local_size": 4},
}


def _inputs(padded: bool, device: str = "cpu"):
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(2, HEADS, LENGTH, DIM, generator=generator).to(device)
    key, value = (torch.randn(2, KV_HEADS, LENGTH, DIM, generator=generator).to(device) for _ in range(2))
    attention_mask = torch.ones(2, LENGTH, dtype=torch.long, device=device)
    if padded:
        attention_mask[0, :11] = 0  # left padding
    mask = extension_mask(batch_size=2, q_length=LENGTH, kv_length=LENGTH, attention_mask=attention_mask, device=device)
    return query, key, value, mask, attention_mask.bool().cpu()


def _module(method: str, temperature: bool, device: str = "cpu") -> SimpleNamespace:
    remap = get_method(method).make_params(original_max_position_embeddings=32, **CASES[method])
    logn = get_method("logn").make_params(original_max_position_embeddings=32) if temperature else None
    rotary = SimpleNamespace(inv_freq=(1.0 / 10000 ** (torch.arange(0, DIM, 2) / DIM)).to(device))
    return SimpleNamespace(hf_posenc_extension=ExtensionState(remap, logn, rotary, DIM), training=False, layer_idx=1)


@pytest.mark.parametrize("strategy", ["_per_segment", "_side_by_side"])
@pytest.mark.parametrize("method", sorted(CASES))
@pytest.mark.parametrize("padded", [False, True])
def test_flex_strategies_equal_the_eager_reference(strategy, method, padded):
    query, key, value, mask, real = _inputs(padded)
    module = _module(method, temperature=method == "self-extend")
    expected = extension_eager_attention(module, query, key, value, mask, DIM**-0.5)[0]  # (B, q, H, D)
    state = module.hf_posenc_extension
    scaled = scaled_queries(state, query, mask.query_positions)
    with torch.no_grad():
        output = getattr(extension_flex, strategy)(state, mask, scaled, key, value, DIM**-0.5, False).transpose(1, 2)
    torch.testing.assert_close(output[real], expected[real], rtol=1e-5, atol=1e-5)


@gpu
@pytest.mark.parametrize("method", sorted(CASES))
@pytest.mark.parametrize("padded", [False, True])
def test_the_compiled_cuda_path_equals_the_eager_reference(method, padded):
    """What a model on CUDA runs: the backend's entry compiles flex (dynamic shapes) and calls it per segment."""
    query, key, value, mask, real = _inputs(padded)
    temperature = method == "self-extend"
    expected = extension_eager_attention(_module(method, temperature), query, key, value, mask, DIM**-0.5)[0]
    query, key, value, mask, _ = _inputs(padded, "cuda")
    module = _module(method, temperature, "cuda")
    with torch.no_grad():
        output = extension_flex_attention(module, query, key, value, mask, DIM**-0.5)[0].cpu()
    torch.testing.assert_close(output[real], expected[real], rtol=1e-3, atol=1e-3)  # flex's float32 dots on CUDA
