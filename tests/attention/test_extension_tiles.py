"""The remaps' prefill as tiles (hf_posenc.attention.extension_tiles, what the sdpa backend runs on a prefill with
padding on the left at most): the tiles of each segment are exactly its pairs, as the papers place them
(tests/extension_reference.py); the tiled attention equals the eager reference on whole and partial blocks and
chunks, left-padded or not; the sdpa backend takes the tiles only where they apply (other padding, a cached step
and a gradient go through its query blocks), and its gradient is the eager reference's."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import extension_reference as ref
import pytest
import torch
from helpers import gpu
from test_extension_flex import CASES, DIM, _inputs, _module
from tiny_models import make_tiny
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import DynamicCache, StaticCache

import hf_posenc
from hf_posenc.attention import extension_tiles
from hf_posenc.attention.extension import extension_eager_attention, extension_mask, scaled_queries
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
    assert extension_tiles.tile_starts(mask, query, key, value) is not None
    output = extension_sdpa_attention(module, query, key, value, mask, DIM**-0.5)[0]
    assert output.dtype == value.dtype
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)


def test_the_cuda_kernels_return_the_output_and_a_log_sum_exp_per_query():
    """The CUDA calls' results on the meta device (no GPU here): flash and cuDNN in bfloat16 (cuDNN's
    log-sum-exp ``(B, H, n, 1)`` reshaped), memory-efficient attention in float32 (its log-sum-exp cut to the
    queries), all ``(B, H, n, D)`` and ``(B, H, n)``."""
    kernels = [
        (extension_tiles.cuda_flash_kernel, torch.bfloat16),
        (extension_tiles.cuda_cudnn_kernel, torch.bfloat16),
        (extension_tiles.cuda_efficient_kernel, torch.float32),
    ]
    for kernel, dtype in kernels:
        for causal, (rows, cols) in [(True, (40, 40)), (False, (40, 72))]:
            query = torch.empty(3, 4, rows, 64, device="meta", dtype=dtype)
            key = torch.empty(3, 4, cols, 64, device="meta", dtype=dtype)
            output, lse = kernel(query, key, key, causal, 0.125)
            assert output.shape == (3, 4, rows, 64) and lse.shape == (3, 4, rows)


def _by_schema(op, lse_layout: str | None):
    """A CPU stand-in for a CUDA attention op: its arguments bound to their names by the op's own schema, then
    attention computed from those names (``is_causal``, ``scale``, ``compute_log_sumexp``), its log-sum-exp as the
    op lays it out (``"padded"`` to 32 rows: memory-efficient attention; ``"column"``, ``(B, H, n, 1)``: cuDNN);
    the outputs in the schema's order."""
    names = [argument.name for argument in op.default._schema.arguments]
    outputs = len(op.default._schema.returns)

    def run(*args, **kwargs):
        bound = {argument.name: argument.default_value for argument in op.default._schema.arguments}
        bound.update(zip(names, args, strict=False))
        bound.update(kwargs)
        assert bound["dropout_p"] == 0.0 and bound.get("attn_bias") is None and not bound.get("return_debug_mask")
        query, key, value = bound["query"], bound["key"], bound["value"]
        scores = query @ key.transpose(-1, -2) * bound["scale"]
        if bound["is_causal"]:
            scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), -torch.inf)
        lse = torch.logsumexp(scores, -1)
        if lse_layout is not None:
            assert bound["compute_log_sumexp"]
        if lse_layout == "padded":
            lse = torch.cat((lse, lse.new_full((*lse.shape[:-1], -lse.shape[-1] % 32), 7.0)), -1)
        elif lse_layout == "column":
            lse = lse[..., None]
        return (torch.softmax(scores, -1) @ value, lse, *[None] * (outputs - 2))

    return run


@pytest.mark.parametrize("kernel", ["cuda_flash_kernel", "cuda_efficient_kernel", "cuda_cudnn_kernel"])
@pytest.mark.parametrize("method", sorted(CASES))
def test_the_cuda_kernels_pass_their_arguments_by_the_ops_schemas(monkeypatch, method, kernel):
    """Each CUDA kernel's call read as the op's schema reads it (a stand-in computing what those arguments ask
    for, on the CPU) gives the tiled attention the eager reference's output: which flag is causal, the scale,
    the log-sum-exp asked for and cut to the queries."""
    for name, lse_layout in [
        ("_scaled_dot_product_flash_attention", None),
        ("_scaled_dot_product_efficient_attention", "padded"),
        ("_scaled_dot_product_cudnn_attention", "column"),
    ]:
        monkeypatch.setattr(torch.ops.aten, name, _by_schema(getattr(torch.ops.aten, name), lse_layout))
    monkeypatch.setattr(extension_tiles, "cpu_kernel", getattr(extension_tiles, kernel))
    query, key, value, mask, _ = _inputs(False, q_length=50, kv_length=50)
    module = _module(method, True)
    expected = extension_eager_attention(module, query, key, value, mask, DIM**-0.5)[0]
    output = extension_tiles.tiled_attention(
        module.hf_posenc_extension,
        mask,
        scaled_queries(module.hf_posenc_extension, query, mask.query_positions),
        key,
        value,
        DIM**-0.5,
    )
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)


def _cuda_like(dtype: torch.dtype = torch.bfloat16, dim: int = 64) -> SimpleNamespace:
    return SimpleNamespace(shape=(1, 4, 8, dim), dtype=dtype, is_cuda=True, device=torch.device("cuda", 0))


def _sdpa_choosing(monkeypatch, backend: SDPBackend | None) -> list[bool]:
    """``torch._fused_sdp_choice`` answering ``backend`` for every call (``None``: raising, as it does where
    ``sdpa_kernel`` leaves no kernel that takes the call); the ``is_causal`` of each call, in order."""
    causal: list[bool] = []

    def choice(query, key, value, *, is_causal):
        causal.append(is_causal)
        if backend is None:
            raise RuntimeError("No viable backend for scaled_dot_product_attention was found.")
        return backend.value

    monkeypatch.setattr(torch, "_fused_sdp_choice", choice)
    return causal


@pytest.mark.parametrize(
    ("backend", "takes"),
    [
        (SDPBackend.CUDNN_ATTENTION, True),
        (SDPBackend.FLASH_ATTENTION, True),
        (SDPBackend.EFFICIENT_ATTENTION, True),
        (SDPBackend.MATH, False),  # no log-sum-exp: float64, a head dimension no fused kernel takes, sdpa_kernel
        (None, False),
    ],
)
def test_on_cuda_the_tiles_take_a_prefill_sdpa_would_run_on_a_fused_kernel(monkeypatch, backend, takes):
    causal = _sdpa_choosing(monkeypatch, backend)
    assert extension_tiles._kernel_takes(_cuda_like(), _cuda_like()) is takes
    assert causal == [True]
    assert extension_tiles._kernel_takes(_cuda_like(), _cuda_like(dim=32)) is False  # values not as wide
    # SDPA pads a head dimension to a multiple of 8 before flash attention's op, which refuses others; no padding here
    assert extension_tiles._kernel_takes(_cuda_like(dim=60), _cuda_like(dim=60)) is False


@pytest.mark.parametrize(
    ("backend", "kernel"),
    [
        (SDPBackend.CUDNN_ATTENTION, "cuda_cudnn_kernel"),
        (SDPBackend.FLASH_ATTENTION, "cuda_flash_kernel"),
        (SDPBackend.EFFICIENT_ATTENTION, "cuda_efficient_kernel"),
        (SDPBackend.MATH, "cuda_efficient_kernel"),  # a tile no fused kernel of sdpa's choice takes
        (None, "cuda_efficient_kernel"),
    ],
)
@pytest.mark.parametrize("causal", [True, False])
def test_on_cuda_each_tile_runs_the_kernel_sdpa_would_run_it_on(monkeypatch, backend, kernel, causal):
    """The choice is made per call, with the tile's own causality (a full rectangle is not causal)."""
    asked = _sdpa_choosing(monkeypatch, backend)
    called = []
    for name in extension_tiles.CUDA_KERNELS.values():
        monkeypatch.setattr(extension_tiles, name, lambda *args, name=name: called.append((name, args[3])))
    extension_tiles._attend(_cuda_like(), None, None, causal, 0.125)
    assert called == [(kernel, causal)] and asked == [causal]


def test_this_pytorch_answers_the_choice_as_the_tiles_ask_it():
    """``torch._fused_sdp_choice`` takes the call :func:`~hf_posenc.attention.extension_tiles._kernel` makes, and
    its answers are :class:`SDPBackend` values (on a CPU: flash attention)."""
    query = torch.randn(1, 2, 8, 16)
    assert torch._fused_sdp_choice(query, query, query, is_causal=True) == SDPBackend.FLASH_ATTENTION.value
    assert set(extension_tiles.CUDA_KERNELS) < {backend.value for backend in SDPBackend.__members__.values()}


@pytest.fixture
def fresh_op_checks():
    """Each op's check made anew in the test, and forgotten after it (it is cached)."""
    extension_tiles._op_as_called.cache_clear()
    yield
    extension_tiles._op_as_called.cache_clear()


def test_this_pytorch_has_each_op_as_the_kernels_call_it(fresh_op_checks):
    """The private ops' arguments and outputs as :data:`~hf_posenc.attention.extension_tiles.CALLED` says (checked
    on PyTorch 2.13 and 2.14's schemas), or the tiles would never run."""
    assert all(extension_tiles._op_as_called(name) for name in extension_tiles.CALLED)
    assert set(extension_tiles.OPS.values()) == set(extension_tiles.CALLED)


@pytest.mark.parametrize(
    "called",
    [
        (("query", "key", "value", "is_causal", "dropout_p"), ("output", "logsumexp")),  # reordered arguments
        (("query", "key", "value", "dropout_p", "is_causal"), ("logsumexp", "output")),  # reordered outputs
    ],
)
def test_an_op_another_pytorch_changed_makes_the_prefill_take_the_query_blocks(monkeypatch, fresh_op_checks, called):
    """A PyTorch release whose private op takes or returns otherwise: a warning naming the op, no tiles, and the
    backend still equals the reference."""
    name = extension_tiles.OPS["cpu_kernel"]
    monkeypatch.setitem(extension_tiles.CALLED, name, called)
    query, key, value, mask, _ = _inputs(False, q_length=24, kv_length=24)
    with pytest.warns(UserWarning, match=f"torch.ops.aten.{name} is not the op hf_posenc calls"):
        assert extension_tiles.tile_starts(mask, query, key, value) is None
    module = _module("dca", False)
    expected = extension_eager_attention(module, query, key, value, mask, DIM**-0.5)[0]
    torch.testing.assert_close(extension_sdpa_attention(module, query, key, value, mask, DIM**-0.5)[0], expected)


def test_a_float64_prefill_keeps_float64_precision(monkeypatch):
    """The merge runs in the model's float64: the tiles equal the query blocks (one float64 SDPA call per block)
    to float64 rounding, not float32's (the eager reference's logits are float32)."""
    query, key, value, mask, _ = _inputs(False, q_length=83, kv_length=83)
    query, key, value = (tensor.double() for tensor in (query, key, value))
    module = _module("self-extend", True)
    output = extension_sdpa_attention(module, query, key, value, mask, DIM**-0.5)[0]
    monkeypatch.setattr(extension_tiles, "tile_starts", lambda *args: None)
    expected = extension_sdpa_attention(module, query, key, value, mask, DIM**-0.5)[0]
    torch.testing.assert_close(output, expected, rtol=1e-12, atol=1e-12)


def _left_padded(paddings: list[int], length: int) -> tuple[torch.Tensor, ...]:
    """q, k, v of one row per entry of ``paddings`` (that many padding tokens first; ``length``: a row of padding
    alone), their mask, and the attention mask."""
    generator = torch.Generator().manual_seed(len(paddings) * length)
    query = torch.randn(len(paddings), 6, length, DIM, generator=generator)
    key, value = (torch.randn(len(paddings), 2, length, DIM, generator=generator) for _ in range(2))
    attention_mask = torch.ones(len(paddings), length, dtype=torch.long)
    for row, padding in enumerate(paddings):
        attention_mask[row, :padding] = 0
    mask = extension_mask(batch_size=len(paddings), q_length=length, kv_length=length, attention_mask=attention_mask)
    return query, key, value, mask, attention_mask


@pytest.mark.parametrize("paddings", [[0, 5], [11, 3, 3, 0], [7, 50], [50, 50], [2, 2]])
@pytest.mark.parametrize("method", sorted(CASES))
def test_a_left_padded_prefill_takes_the_tiles_and_equals_the_eager_reference(method, paddings):
    """Rows padded alike are one prefill of their tokens (row groups of one and of two, whole chunks and windows
    of padding, a row of padding alone): every output, padding rows' zeros included, is the eager reference's."""
    query, key, value, mask, _ = _left_padded(paddings, 50)
    assert extension_tiles.tile_starts(mask, query, key, value) == paddings
    module = _module(method, True)
    expected = extension_eager_attention(module, query, key, value, mask, DIM**-0.5)[0]
    output = extension_sdpa_attention(module, query, key, value, mask, DIM**-0.5)[0]
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gaps", [[(45, 50)], [(10, 20)], [(1, 10)], [(0, 5), (30, 31)]])
def test_padding_other_than_on_the_left_takes_the_query_blocks(gaps):
    """Padding after a row's first token (on the right, or a gap) is no prefill of ``0 .. n-1`` from one start:
    the query blocks serve it, equal to the reference."""
    query, key, value, _, attention_mask = _left_padded([0, 0], 50)
    for start, stop in gaps:
        attention_mask[1, start:stop] = 0
    mask = extension_mask(batch_size=2, q_length=50, kv_length=50, attention_mask=attention_mask)
    assert extension_tiles.tile_starts(mask, query, key, value) is None
    module = _module("self-extend", False)
    expected = extension_eager_attention(module, query, key, value, mask, DIM**-0.5)[0]
    torch.testing.assert_close(extension_sdpa_attention(module, query, key, value, mask, DIM**-0.5)[0], expected)


def test_queries_past_the_first_position_take_the_query_blocks():
    """Queries at 30 .. 69 over 40 keys (what no cache of transformers 5.24 passes, but a mask may say): not a
    prefill from position 0, so no tiles, and the backend still equals the reference."""
    query, key, value, _, _ = _inputs(False, q_length=40, kv_length=40)
    mask = extension_mask(batch_size=2, q_length=40, kv_length=40, q_offset=30)
    assert extension_tiles.tile_starts(mask, query, key, value) is None
    module = _module("self-extend", False)
    expected = extension_eager_attention(module, query, key, value, mask, DIM**-0.5)[0]
    torch.testing.assert_close(extension_sdpa_attention(module, query, key, value, mask, DIM**-0.5)[0], expected)


def _tiled_calls(monkeypatch) -> list:
    calls = []
    tiled = extension_tiles.tiled_attention
    monkeypatch.setattr(extension_tiles, "tiled_attention", lambda *args: calls.append(1) or tiled(*args))
    return calls


def test_the_sdpa_backend_takes_the_tiles_on_a_prefill_only(monkeypatch):
    """A prefill and a left-padded batch run tiles in every layer; a decoding step after it and a forward that
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
        assert len(calls) == layers
        padded = {name: model(ids, attention_mask=padding).logits for name, model in models.items()}
        assert len(calls) == 2 * layers
        alone = models["sdpa"](ids[:1, 5:]).logits
    torch.testing.assert_close(step["sdpa"], step["eager"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(padded["sdpa"][:, 5:], padded["eager"][:, 5:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(padded["sdpa"][:1, 5:], alone, rtol=1e-5, atol=1e-5)
    models["sdpa"](ids).logits.sum().backward()
    assert len(calls) == 3 * layers


@pytest.mark.parametrize("method", ["self-extend", "dca"])
def test_a_static_cache_prefill_takes_the_tiles(monkeypatch, method):
    """A static cache hands attention all its slots (100 here) for a 40-token prompt: the prompt's keys are its
    first 40, the later slots lie past every query, so the prefill takes the tiles; the next step does not. Both
    equal the eager backend."""
    calls = _tiled_calls(monkeypatch)
    params = {"group_size": 2, "window": 8} if method == "self-extend" else {"chunk_size": 24, "local_size": 4}
    models = {
        backend: hf_posenc.patch(make_tiny("llama"), method, **params, backend=backend) for backend in ("sdpa", "eager")
    }
    cache_name = "cache" if "cache" in inspect.signature(models["sdpa"].forward).parameters else "past_key_values"
    caches = {name: StaticCache(model.config, max_cache_len=100) for name, model in models.items()}
    ids = torch.randint(1, 97, (1, 41), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        prompt = {name: model(ids[:, :40], **{cache_name: caches[name]}).logits for name, model in models.items()}
        assert len(calls) == models["sdpa"].config.num_hidden_layers
        step = {name: model(ids[:, 40:], **{cache_name: caches[name]}).logits for name, model in models.items()}
    assert len(calls) == models["sdpa"].config.num_hidden_layers
    torch.testing.assert_close(prompt["sdpa"], prompt["eager"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step["sdpa"], step["eager"], rtol=1e-5, atol=1e-5)


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
@pytest.mark.parametrize(
    ("dtype", "backend"),
    [
        (torch.bfloat16, SDPBackend.CUDNN_ATTENTION),
        (torch.bfloat16, SDPBackend.FLASH_ATTENTION),
        (torch.bfloat16, SDPBackend.EFFICIENT_ATTENTION),
        (torch.float32, SDPBackend.EFFICIENT_ATTENTION),
    ],
)
@pytest.mark.parametrize("method", sorted(CASES))
def test_tiled_attention_on_cuda_equals_the_eager_reference(method, dtype, backend):
    """What a prefill on CUDA runs with the sdpa backend, with each fused kernel SDPA may dispatch to (cuDNN,
    flash and memory-efficient attention, kept to one by ``sdpa_kernel``; skipped where this GPU's SDPA does not
    run it), on inputs of 83 tokens: whole and partial blocks and chunks."""
    query, key, value, mask, _ = _inputs(False, q_length=83, kv_length=83)
    expected = extension_eager_attention(_module(method, True), query, key, value, mask, DIM**-0.5)[0]
    query, key, value, mask, _ = _inputs(False, "cuda", q_length=83, kv_length=83)
    query, key, value = (tensor.to(dtype) for tensor in (query, key, value))
    with sdpa_kernel([backend]):
        if extension_tiles._kernel(query, query, query, True) != extension_tiles.CUDA_KERNELS[backend.value]:
            pytest.skip(f"this GPU's SDPA does not run {backend.name} on {dtype}")
        assert extension_tiles.tile_starts(mask, query, key, value) is not None
        output = extension_sdpa_attention(_module(method, True, "cuda"), query, key, value, mask, DIM**-0.5)[0]
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(output.float().cpu(), expected, rtol=tolerance, atol=tolerance)


def test_merging_two_calls_gives_the_softmax_over_both_and_a_first_call_as_it_is():
    """``_merge`` on its own: a call reaching rows no call reached is copied (bit for bit); a later one gives the
    softmax over the keys of both (float64 formula); rows reached by one of the two only (a call reaching some
    rows first) are that call's, as the running output starts at 0 and -inf."""
    generator = torch.Generator().manual_seed(0)
    outputs = [torch.randn(1, 2, 3, 4, 8, generator=generator, dtype=torch.bfloat16) for _ in range(2)]
    lses = [torch.randn(1, 2, 3, 4, generator=generator) * 3 for _ in range(2)]
    total, total_lse = torch.zeros(1, 2, 3, 4, 8), torch.full((1, 2, 3, 4), -torch.inf)
    seen = torch.zeros(3, 4, dtype=torch.bool)
    extension_tiles._merge(total, total_lse, seen, outputs[0], lses[0])
    assert torch.equal(total, outputs[0].float()) and torch.equal(total_lse, lses[0]) and bool(seen.all())
    extension_tiles._merge(total, total_lse, seen, outputs[1], lses[1])
    weights = torch.stack(lses).double().softmax(0)[..., None]
    expected = (weights * torch.stack(outputs).double()).sum(0)
    torch.testing.assert_close(total.double(), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(total_lse.double(), torch.stack(lses).double().logsumexp(0), rtol=1e-6, atol=1e-6)
    total, total_lse = torch.zeros(1, 2, 3, 4, 8), torch.full((1, 2, 3, 4), -torch.inf)
    seen = torch.zeros(3, 4, dtype=torch.bool)
    extension_tiles._merge(total[:, :, :1], total_lse[:, :, :1], seen[:1], outputs[0][:, :, :1], lses[0][:, :, :1])
    extension_tiles._merge(total, total_lse, seen, outputs[1], lses[1])
    assert torch.equal(total[:, :, 1:], outputs[1][:, :, 1:].float()) and torch.equal(
        total_lse[:, :, 1:], lses[1][:, :, 1:]
    )
    torch.testing.assert_close(total[:, :, :1].double(), expected[:, :, :1], rtol=1e-6, atol=1e-6)
