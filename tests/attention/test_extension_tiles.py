"""The remaps' prefill as tiles (hf_posenc.attention.extension_tiles, what the sdpa backend runs on a prefill without
padding): the tiles of each segment are exactly its pairs, as the papers place them (tests/extension_reference.py);
the tiled attention equals the eager reference on whole and partial blocks and chunks; the sdpa backend takes the
tiles only where they apply (a padded batch, a cached step and a gradient go through its query blocks), and its
gradient is the eager reference's."""

from __future__ import annotations

import inspect

import extension_reference as ref
import pytest
import torch
from conftest import make_tiny
from helpers import gpu
from test_extension_flex import CASES, DIM, _inputs, _module
from transformers import DynamicCache

import hf_posenc
from hf_posenc.attention import extension_tiles
from hf_posenc.attention.extension import extension_eager_attention
from hf_posenc.attention.extension_blocks import extension_sdpa_attention
from hf_posenc.registry import get_method

GRIDS = {
    "self-extend": [{"group_size": g, "window": w} for g in (1, 2, 3) for w in (g, 2 * g, 3 * g, 6)],
    "dca": [{"chunk_size": c, "local_size": local} for c in (3, 5, 12) for local in (1, 2, 4) if local < c],
}


def _covered(tiles: list, length: int) -> torch.Tensor:
    """How many times each (query, key) pair of a ``length``-token prefill lies in ``tiles``, ``(n, n)``."""
    counts = torch.zeros(length, length, dtype=torch.int64)
    for tile in tiles:
        a, b = torch.arange(tile.rows)[:, None], torch.arange(tile.cols)[None, :]
        keep = {"full": torch.ones(tile.rows, tile.cols, dtype=torch.bool), "lower": b <= a, "upper": b > a}
        for index in range(tile.count):
            rows = slice(tile.query_start + index * tile.rows, tile.query_start + (index + 1) * tile.rows)
            cols = slice(tile.key_start + index * tile.rows, tile.key_start + index * tile.rows + tile.cols)
            counts[rows, cols] += keep[tile.shape].long()
    return counts


@pytest.mark.parametrize("method", sorted(GRIDS))
def test_the_tiles_of_each_segment_are_exactly_its_pairs(method):
    """Every causal pair of every prefill from 1 to 39 tokens lies in exactly one tile of the segment the paper
    puts it in, and no tile holds another pair: whole and partial windows, blocks and chunks, G = 1, W = G."""
    for params in GRIDS[method]:
        remap = get_method(method).make_params(original_max_position_embeddings=64, **params)
        for length in range(1, 40):
            for segment, (_, _, pairs) in enumerate(ref.segments(method, length, **params)):
                counts = _covered(remap.tiles(segment, length), length)
                assert torch.equal(counts, pairs.long()), (params, length, segment)


@pytest.mark.parametrize("temperature", [False, True])
@pytest.mark.parametrize("length", [1, 7, 8, 9, 24, 50, 83])
@pytest.mark.parametrize("method", sorted(CASES))
def test_tiled_attention_equals_the_eager_reference(method, length, temperature):
    """Self-Extend (W = 8) and DCA (s = 20) on random q, k, v with grouped heads, two rows: inputs shorter than
    one block, on a block's edge, and past whole blocks and chunks with a partial one."""
    query, key, value, mask, _ = _inputs(False, q_length=length, kv_length=length)
    module = _module(method, temperature)
    expected = extension_eager_attention(module, query, key, value, mask, DIM**-0.5)[0]
    assert extension_tiles.applies(mask, query, key, value)
    output = extension_sdpa_attention(module, query, key, value, mask, DIM**-0.5)[0]
    assert output.dtype == value.dtype
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)


def test_the_cuda_kernels_return_the_output_and_a_log_sum_exp_per_query():
    """The CUDA calls' arguments and results, on the meta device (no GPU here): flash in bfloat16, memory-efficient
    attention in float32 (its log-sum-exp cut to the queries), both ``(B, H, n, D)`` and ``(B, H, n)``."""
    for kernel, dtype in [
        (extension_tiles.cuda_flash_kernel, torch.bfloat16),
        (extension_tiles.cuda_efficient_kernel, torch.float32),
    ]:
        for causal, (rows, cols) in [(True, (40, 40)), (False, (40, 72))]:
            query = torch.empty(3, 4, rows, 64, device="meta", dtype=dtype)
            key = torch.empty(3, 4, cols, 64, device="meta", dtype=dtype)
            output, lse = kernel(query, key, key, causal, 0.125)
            assert output.shape == (3, 4, rows, 64) and lse.shape == (3, 4, rows)


def _tiled_calls(monkeypatch) -> list:
    calls = []
    tiled = extension_tiles.tiled_attention
    monkeypatch.setattr(extension_tiles, "tiled_attention", lambda *args: calls.append(1) or tiled(*args))
    return calls


def test_the_sdpa_backend_takes_the_tiles_on_a_prefill_only(monkeypatch):
    """A prefill runs tiles in every layer; a left-padded batch, a decoding step after it, and a forward that
    carries a gradient run the query blocks. Each equals the eager backend."""
    calls = _tiled_calls(monkeypatch)
    models = {
        backend: hf_posenc.patch(make_tiny("llama"), "self-extend", group_size=2, window=8, backend=backend)
        for backend in ("sdpa", "eager")
    }
    layers = models["sdpa"].config.num_hidden_layers
    ids = torch.randint(1, 97, (2, 40), generator=torch.Generator().manual_seed(0))
    padding = torch.ones_like(ids)
    padding[0, :5] = 0
    # transformers 5.24 renamed forward's past_key_values to cache (the old name warns, and goes in 5.40)
    cache_name = "cache" if "cache" in inspect.signature(models["sdpa"].forward).parameters else "past_key_values"
    caches = {name: DynamicCache(config=model.config) for name, model in models.items()}
    with torch.no_grad():
        logits = {name: model(ids, **{cache_name: caches[name]}).logits for name, model in models.items()}
        assert len(calls) == layers
        torch.testing.assert_close(logits["sdpa"], logits["eager"], rtol=1e-5, atol=1e-5)
        step = {name: model(ids[:, :1], **{cache_name: caches[name]}).logits for name, model in models.items()}
        padded = {name: model(ids, attention_mask=padding).logits for name, model in models.items()}
    assert len(calls) == layers
    torch.testing.assert_close(step["sdpa"], step["eager"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(padded["sdpa"][1], padded["eager"][1], rtol=1e-5, atol=1e-5)
    models["sdpa"](ids).logits.sum().backward()
    assert len(calls) == layers


@pytest.mark.parametrize("method", sorted(CASES))
def test_the_sdpa_backend_gradient_is_the_eager_references(method):
    """Under autograd the kernels' log-sum-exp carries no gradient, so the backend runs its query blocks: the
    gradients of q, k and v equal the eager reference's (the tiles' would not)."""
    grads = {}
    for name, function in [("eager", extension_eager_attention), ("sdpa", extension_sdpa_attention)]:
        query, key, value, mask, _ = _inputs(False)
        for tensor in (query, key, value):
            tensor.requires_grad_()
        output = function(_module(method, True), query, key, value, mask, DIM**-0.5)[0]
        (output * torch.linspace(-1, 1, output.shape[-1])).sum().backward()
        grads[name] = [tensor.grad for tensor in (query, key, value)]
    for actual, expected in zip(grads["sdpa"], grads["eager"], strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("method", sorted(CASES))
def test_tiled_attention_on_cuda_equals_the_eager_reference(method, dtype):
    """What a prefill on CUDA runs with the sdpa backend: flash attention in bfloat16, memory-efficient attention
    in float32 (inputs of 83 tokens: whole and partial blocks and chunks)."""
    query, key, value, mask, _ = _inputs(False, q_length=83, kv_length=83)
    expected = extension_eager_attention(_module(method, True), query, key, value, mask, DIM**-0.5)[0]
    query, key, value, mask, _ = _inputs(False, "cuda", q_length=83, kv_length=83)
    query, key, value = (tensor.to(dtype) for tensor in (query, key, value))
    assert extension_tiles.applies(mask, query, key, value)
    output = extension_sdpa_attention(_module(method, True, "cuda"), query, key, value, mask, DIM**-0.5)[0]
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(output.float().cpu(), expected, rtol=tolerance, atol=tolerance)
