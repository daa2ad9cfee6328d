"""The cudnn ALiBi backend: cuDNN's slopes against the paper's, its graphs against cuDNN's own validation
(no GPU needed), the dispatch between the fused kernel and flex, and, on a GPU, the kernel itself."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import generate, gpu
from tiny_models import make_tiny

import hf_posenc
from hf_posenc.attention import ALIBI, cudnn, functions
from hf_posenc.attention.functions import cudnn_self_check, paper_alibi_attention
from hf_posenc.methods import alibi_slopes

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
needs_frontend = pytest.mark.skipif(not cudnn.installed(), reason="needs nvidia-cudnn-frontend")


def cudnn_frontend_slopes(n_heads: int) -> list[float]:
    """``get_alibi_slope`` of cudnn-frontend (include/cudnn_frontend_utils.h), transcribed line by line:
    float32 arithmetic and powf, as cuDNN fills its slope buffer."""
    f32 = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    n = 1 << int(math.log2(n_heads))
    slope = [f32(i + 1.0) for i in range(n)]
    slope += [f32(i + 1) * f32(0.5) for i in range(0, 2 * (n_heads - n), 2)]
    return [torch.pow(f32(2.0), elem * f32(-8.0) / f32(n)).item() for elem in slope]


@pytest.mark.parametrize("heads", range(1, 65))
def test_cudnn_applies_the_papers_slopes(heads):
    """What cuDNN computes for itself equals the paper's slopes, for powers of two and the rest alike."""
    torch.testing.assert_close(
        torch.tensor(cudnn_frontend_slopes(heads)), alibi_slopes(heads, dtype=torch.float32), rtol=2e-7, atol=0
    )


def rows(batch, length, heads, dim, dtype=torch.bfloat16, seed=0):
    """``(B, H, T, D)`` laid out as ``(B, T, H, D)``, as attention modules pass them."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, length, heads, dim, generator=generator, dtype=dtype).transpose(1, 2)


@needs_frontend
@pytest.mark.parametrize("heads,kv_heads,dim", [(32, 32, 128), (32, 8, 128), (12, 4, 64), (6, 2, 16)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_graphs_pass_cudnns_validation(heads, kv_heads, dim, dtype):
    """The forward (inference and training) and backward graphs are ones cuDNN's frontend accepts: ALiBi with
    the causal band, grouped-query attention, the layouts transformers passes. No GPU needed to validate."""
    query, key, value = (rows(2, 256, h, dim, dtype) for h in (heads, kv_heads, kv_heads))
    for training in (False, True):
        graph = cudnn.forward_graph(query, key, value, dim**-0.5, training)
        assert (graph.stats is not None) == training
    output = cudnn.new_output(query)
    assert output.transpose(1, 2).is_contiguous()  # (B, T, H, D) rows: the module's reshape is free
    stats = torch.empty(2, heads, 256, 1)
    cudnn.backward_graph(query, key, value, output, output, stats, dim**-0.5)


@needs_frontend
def test_graph_validation_can_fail():
    """The validation above is cuDNN's own: a layout it cannot take (a head count that does not divide) fails."""
    with pytest.raises(Exception, match="(?i)head"):
        cudnn.forward_graph(rows(1, 64, 6, 16), rows(1, 64, 4, 16), rows(1, 64, 4, 16), 0.25, False)


@pytest.fixture
def fake_kernel(monkeypatch):
    """The fused kernel replaced by the formula it computes (no GPU here), counting its calls."""
    calls = []

    def fused(query, key, value, scale):
        calls.append(tuple(query.shape))
        output = cudnn.new_output(query)
        return output.copy_(paper_alibi_attention(query, key, value, scale).transpose(1, 2))

    monkeypatch.setattr(functions, "cudnn_self_check", lambda *args: None)  # as on a GPU where it passed
    monkeypatch.setattr(cudnn, "prepare", lambda *args, **kwargs: True)
    monkeypatch.setattr(cudnn, "fused_alibi_attention", fused)
    return calls


def on_cudnn(family="llama", **overrides):
    """A tiny ALiBi model dispatching through the cudnn backend (selected through transformers: on CPU the
    patch itself refuses backend='cudnn'), and its eager twin."""
    models = []
    for _ in range(2):
        model = make_tiny(family, **overrides)
        hf_posenc.patch(model, "alibi", backend="eager")
        models.append(model)
    models[0].set_attn_implementation(ALIBI.implementation("cudnn"))
    return models


def test_plain_prefill_takes_the_fused_kernel(fake_kernel):
    model, eager = on_cudnn()
    ids = torch.randint(1, 97, (2, 50), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids, attention_mask=torch.ones_like(ids)).logits
        torch.testing.assert_close(logits, eager(ids).logits, rtol=1e-5, atol=1e-5)
    assert fake_kernel == [(2, 4, 50, 16)] * model.config.num_hidden_layers


def test_padding_and_the_cache_go_to_flex(fake_kernel):
    """Left padding: positions are not indices, so flex; generation: the prefill is fused, each cached
    decoding step (one query, longer keys) is flex. Results equal the eager backend's either way."""
    model, eager = on_cudnn()
    ids = torch.randint(1, 97, (2, 30), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids, attention_mask=mask).logits[mask.bool()], eager(ids, attention_mask=mask).logits[mask.bool()]
        )
    assert fake_kernel == []
    sequences, logits = generate(model, ids[:1], new=12)
    eager_sequences, eager_logits = generate(eager, ids[:1], new=12)
    assert torch.equal(sequences, eager_sequences)
    torch.testing.assert_close(logits, eager_logits, rtol=1e-4, atol=1e-4)
    assert fake_kernel == [(1, 4, 30, 16)] * model.config.num_hidden_layers  # the prefill only


def test_a_sliding_window_goes_to_flex(fake_kernel):
    """Mistral with a window shorter than the input: not the plain causal band cuDNN's ALiBi has."""
    model, eager = on_cudnn("mistral", sliding_window=8)
    ids = torch.randint(1, 97, (1, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, eager(ids).logits, rtol=1e-5, atol=1e-5)
    assert fake_kernel == []


def test_slopes_other_than_the_papers_go_to_flex(fake_kernel):
    """cuDNN computes the paper's slopes itself: a model patched with its own slopes and switched to cudnn
    afterwards (the patch refuses cudnn for it) must not reach the kernel."""
    slopes = (0.5, 0.3, 0.2, 0.1)
    models = []
    for _ in range(2):
        model = make_tiny("llama")
        hf_posenc.patch(model, "alibi", backend="eager", slopes=slopes)
        models.append(model)
    models[0].set_attn_implementation(ALIBI.implementation("cudnn"))
    ids = torch.randint(1, 97, (1, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(models[0](ids).logits, models[1](ids).logits, rtol=1e-5, atol=1e-5)
    assert fake_kernel == []


def test_dropout_in_training_is_refused(fake_kernel):
    model, _ = on_cudnn(attention_dropout=0.1)
    model.train()
    with pytest.raises(ValueError, match="cudnn backend has no attention dropout"):
        model(torch.randint(1, 97, (1, 10)))


@gpu
@pytest.mark.skipif(not cudnn.installed(), reason="needs nvidia-cudnn-frontend")
@pytest.mark.parametrize("heads,kv_heads,dim", [(32, 8, 128), (12, 4, 64), (6, 6, 64)])
def test_fused_kernel_matches_the_formula_forward_and_backward(heads, kv_heads, dim):
    """The kernel on a GPU against the float32 formula with the paper's slopes (non-powers of two included),
    outputs and the gradients of q, k and v."""
    inputs = [rows(2, 1024, h, dim).cuda().requires_grad_() for h in (heads, kv_heads, kv_heads)]
    assert cudnn_self_check(torch.device("cuda", 0), heads, kv_heads, dim) is None
    assert cudnn.prepare(*inputs, dim**-0.5, training=True)
    output = cudnn.fused_alibi_attention(*inputs, dim**-0.5)
    reference_inputs = [t.detach().float().requires_grad_() for t in inputs]
    expected = paper_alibi_attention(*reference_inputs, dim**-0.5).transpose(1, 2)  # (B, H, T, D)
    torch.testing.assert_close(output.float(), expected, rtol=0, atol=2e-2)
    grad = torch.randn_like(expected)
    output.backward(grad.to(output.dtype))
    expected.backward(grad)
    for fused, reference in zip(inputs, reference_inputs, strict=True):
        torch.testing.assert_close(fused.grad.float(), reference.grad, rtol=0, atol=5e-2)


@gpu
@pytest.mark.skipif(not cudnn.installed(), reason="needs nvidia-cudnn-frontend")
def test_auto_picks_cudnn_on_a_gpu_and_matches_eager():
    """Prefill (fused) and cached generation (prefill fused, decoding steps flex) against the eager reference
    recomputing the generated sequence; 12 heads: not a power of two."""
    ids = torch.randint(1, 97, (2, 600), generator=torch.Generator().manual_seed(3)).cuda()
    shape = dict(num_attention_heads=12, num_key_value_heads=4, head_dim=64)
    models = {}
    for backend in ("auto", "eager"):
        model = make_tiny("llama", **shape).to("cuda", torch.bfloat16)
        hf_posenc.patch(model, "alibi", backend=backend)
        models[hf_posenc.get_patch(model).params["backend"]] = model
    assert set(models) == {"cudnn", "eager"}
    with torch.no_grad():
        expected = models["eager"](ids).logits.float()
        torch.testing.assert_close(models["cudnn"](ids).logits.float(), expected, rtol=5e-2, atol=5e-2)
    sequences, logits = generate(models["cudnn"], ids[:1, :40], new=20)
    with torch.no_grad():
        expected = models["eager"](sequences).logits[:, 39:-1].float()
    torch.testing.assert_close(logits.float(), expected, rtol=5e-2, atol=5e-2)
