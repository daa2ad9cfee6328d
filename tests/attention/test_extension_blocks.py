"""The query-block backends of the remaps (blocked: explicit float32 logits; sdpa: one fused call per block on the
segments side by side) against the eager reference, on random q, k, v with grouped heads and padding, in blocks
smaller than the input."""

from __future__ import annotations

import pytest
import torch
from helpers import gpu
from test_extension_flex import CASES, DIM, _inputs, _module

from hf_posenc.attention import extension_blocks
from hf_posenc.attention.extension import extension_eager_attention

BACKENDS = {
    "blocked": extension_blocks.extension_blocked_attention,
    "sdpa": extension_blocks.extension_sdpa_attention,
}


@pytest.mark.parametrize("block", [16, 1024])
@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("method", sorted(CASES))
@pytest.mark.parametrize("padded", [False, True])
def test_query_block_backends_equal_the_eager_reference(monkeypatch, backend, method, padded, block):
    """Blocks of 16 rows (11 padding rows first in one sequence of the padded batch) or one block; rows that are
    padding are free (the model never reads them), every real row equals the reference's."""
    monkeypatch.setattr(extension_blocks, "BLOCK", block)
    query, key, value, mask, real = _inputs(padded)
    module = _module(method, temperature=method == "dca")
    expected = extension_eager_attention(module, query, key, value, mask, DIM**-0.5)[0]  # (B, q, H, D)
    output = BACKENDS[backend](module, query, key, value, mask, DIM**-0.5)[0]
    assert output.shape == expected.shape and output.dtype == value.dtype
    torch.testing.assert_close(output[real], expected[real], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(output).all()  # a padding row with no key at all gets zeros, not NaN


def test_sdpa_takes_the_fused_kernel_on_the_segments_side_by_side(monkeypatch):
    """The point of the sdpa backend: on a CPU, PyTorch's flash kernel takes the side-by-side blocks (its values
    padded to the queries' width), not the math fallback that materialises the logits."""
    query, key, value, mask, _ = _inputs(padded=True)
    module = _module("self-extend", temperature=False)
    with torch.profiler.profile() as profile:
        extension_blocks.extension_sdpa_attention(module, query, key, value, mask, DIM**-0.5)
    kernels = {event.key for event in profile.key_averages() if event.key.startswith("aten::_scaled_dot_product")}
    assert kernels == {"aten::_scaled_dot_product_flash_attention_for_cpu"}, kernels


@gpu
@pytest.mark.parametrize("method", sorted(CASES))
@pytest.mark.parametrize("padded", [False, True])
def test_the_sdpa_backend_on_cuda_equals_the_eager_reference(method, padded):
    query, key, value, mask, real = _inputs(padded)
    expected = extension_eager_attention(_module(method, False), query, key, value, mask, DIM**-0.5)[0]
    query, key, value, mask, _ = _inputs(padded, "cuda")
    output = extension_blocks.extension_sdpa_attention(
        _module(method, False, "cuda"), query, key, value, mask, DIM**-0.5
    )
    torch.testing.assert_close(output[0].cpu()[real], expected[real], rtol=1e-3, atol=1e-3)
