"""Both strategies of the remaps' flex backend (CUDA's per-segment calls merged by log-sum-exp, and the CPU's
segments side by side) against the eager reference, on random q, k, v with padding, uncompiled on the CPU."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch
from helpers import gpu

from hf_posenc.attention import compiled_flex, extension_flex
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


def _inputs(padded: bool, device: str = "cpu", q_length: int = LENGTH, kv_length: int = LENGTH):
    """q, k, v of two rows, their mask, and which rows are real (B, kv); ``q_length < kv_length``: the last
    queries, as a decoding step with a cache of ``kv_length - q_length`` tokens sees them."""
    generator = torch.Generator().manual_seed(kv_length)
    query = torch.randn(2, HEADS, q_length, DIM, generator=generator).to(device)
    key, value = (torch.randn(2, KV_HEADS, kv_length, DIM, generator=generator).to(device) for _ in range(2))
    attention_mask = torch.ones(2, kv_length, dtype=torch.long, device=device)
    if padded:
        attention_mask[0, :11] = 0  # left padding
    mask = extension_mask(
        batch_size=2,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=kv_length - q_length,
        attention_mask=attention_mask,
        device=device,
    )
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


@pytest.mark.parametrize("strategy", ["_per_segment", "_side_by_side"])
def test_methods_sharing_one_mask_each_get_their_own_block_masks(strategy):
    """The mask keeps the block masks it builds for every layer; a mask given to several methods (as
    bench_extension gives one to each method it times) must not hand one method's block masks to another (keyed
    by segment alone, they would let DCA after Self-Extend run Self-Extend's masks). Self-Extend with
    another window, then DCA, then the first again, each against its own eager reference."""
    query, key, value, mask, real = _inputs(padded=True)
    other = _module("self-extend", temperature=False)
    other.hf_posenc_extension.remap = get_method("self-extend").make_params(
        original_max_position_embeddings=32, group_size=4, window=16
    )
    for module in (_module("self-extend", False), other, _module("dca", False), _module("self-extend", False)):
        state = module.hf_posenc_extension
        expected = extension_eager_attention(module, query, key, value, mask, DIM**-0.5)[0]
        with torch.no_grad():
            output = getattr(extension_flex, strategy)(state, mask, query, key, value, DIM**-0.5, False)
        torch.testing.assert_close(output.transpose(1, 2)[real], expected[real], rtol=1e-5, atol=1e-5)


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


@pytest.mark.parametrize("method", sorted(CASES))
def test_the_cuda_strategy_compiled_equals_the_reference_and_compiles_once(monkeypatch, method):
    """What CUDA runs, compiled here with ``aot_eager`` (inductor's CPU flex returns no lse): flex through
    ``compiled_flex`` (a prefill compiled for its shapes), the turned q and k and the merge compiled too, on q,
    k, v laid out as a model hands them over (heads transposed out of ``(B, n, H, D)``; the turned ones keep that
    layout). Every segment runs on the one compilation; a later call of the model (new block masks and mask
    functions) and every decoding step after the first run without compiling again."""
    monkeypatch.setattr(extension_flex, "torch_compiled", functools.cache(_aot_eager))
    monkeypatch.setattr(extension_flex, "_on_cuda", lambda mask: True)  # block masks compiled for dynamic shapes
    monkeypatch.setattr(compiled_flex, "_compiled_flex_attention", functools.cache(_aot_eager_flex))
    monkeypatch.setattr(compiled_flex, "_compiled_static_flex_attention", functools.cache(_aot_eager_static_flex))
    monkeypatch.setattr(compiled_flex, "_STATIC", compiled_flex.StaticPrefills())
    torch._dynamo.reset()
    module = _module(method, temperature=method == "self-extend")
    state = module.hf_posenc_extension

    def check(padded: bool, q_length: int, kv_length: int) -> None:
        query, key, value, mask, real = _inputs(padded, q_length=q_length, kv_length=kv_length)
        expected = extension_eager_attention(module, query, key, value, mask, DIM**-0.5)[0]
        query, key, value = (states.transpose(1, 2).contiguous().transpose(1, 2) for states in (query, key, value))
        scaled = scaled_queries(state, query, mask.query_positions)
        with torch.no_grad():
            output = extension_flex._per_segment(state, mask, scaled, key, value, DIM**-0.5, True).transpose(1, 2)
        rows = real[:, -q_length:]
        torch.testing.assert_close(output[rows], expected[rows], rtol=1e-5, atol=1e-5)
        assert torch.equal(output[~rows], torch.zeros_like(output[~rows]))  # padding queries: no key, 0

    try:
        check(True, LENGTH, LENGTH)
        assert len(compiled_flex._STATIC.kinds) == 1 and not compiled_flex._STATIC.closed  # static, one for all
        check(False, 1, LENGTH)  # decoding: the compilation for dynamic shapes
        with torch.compiler.set_stance("fail_on_recompile"):
            check(False, LENGTH, LENGTH)
            for kv_length in (LENGTH + 1, LENGTH + 7):
                check(True, 1, kv_length)
    finally:
        torch._dynamo.reset()


def test_the_merge_of_segments_gives_a_row_without_keys_zero_and_no_nan_gradient():
    """Per-segment flex on CUDA: each segment's output and log-sum-exp, merged into one softmax. A row no
    segment reaches (a padding query) has lse -inf everywhere: its output and its gradients are 0, not NaN."""
    generator = torch.Generator().manual_seed(0)
    outputs = [torch.randn(1, 2, 3, 4, generator=generator, requires_grad=True) for _ in range(3)]
    lses = [torch.randn(1, 2, 3, generator=generator) for _ in range(3)]
    lses[1][0, 0, 1] = -torch.inf  # a row the second segment does not reach
    for lse in lses:
        lse[0, 1, 2] = -torch.inf  # a row no segment reaches
        lse.requires_grad_()
    merged = extension_flex._merged(outputs, lses)
    merged.sum().backward()
    stacked = torch.stack([lse.detach() for lse in lses])
    weights = torch.softmax(stacked, 0).nan_to_num(0.0)  # the one softmax over every segment's keys
    expected = sum(weight[..., None] * output.detach() for weight, output in zip(weights, outputs, strict=True))
    torch.testing.assert_close(merged, expected)
    assert torch.equal(merged[0, 1, 2], torch.zeros(4))
    for tensor in outputs + lses:
        assert torch.isfinite(tensor.grad).all()
    assert all(lse.grad[0, 1, 2] == 0 for lse in lses)


def _aot_eager(function, dynamic: bool):
    return torch.compile(function, dynamic=dynamic, backend="aot_eager")


def _aot_eager_flex():
    return _aot_eager(compiled_flex.flex_attention, True)


def _aot_eager_static_flex():
    return torch.compile(compiled_flex._static_flex, dynamic=False, fullgraph=True, backend="aot_eager")
