"""ALiBi (Press et al. 2022) on RoPE decoders: slopes, the bias against a direct computation, backends,
KV cache, padding, exact unpatch, config round trip and bad input. GPT-2 is in test_gpt2.py."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from helpers import (
    assert_left_padded_batch_generates_as_each_alone,
    assert_same,
    generate,
    gpu,
    paper_slopes,
    plain_load,
    snapshot,
)
from tiny_models import make_tiny
from transformers import AutoModelForCausalLM, BloomConfig, FalconConfig, Gemma2Config, OPTConfig
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import hf_posenc
from hf_posenc.attention import ALIBI, compiled_flex
from hf_posenc.methods import alibi_slopes
from hf_posenc.patching import bias as alibi_planner

BACKENDS = ["eager", "sdpa", "flex"]  # flex runs uncompiled on CPU: a small-size check of the score_mod


pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


@pytest.mark.parametrize("heads", range(1, 65))
def test_slopes_are_the_papers_for_1_to_64_heads(heads):
    slopes = alibi_slopes(heads)
    assert slopes.dtype == torch.float64 and slopes.shape == (heads,)
    torch.testing.assert_close(slopes, torch.tensor(paper_slopes(heads), dtype=torch.float64), rtol=1e-14, atol=0)


def test_slopes_known_values():
    assert alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]  # the paper's 1/2 ... 1/256
    expected = torch.tensor([2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5], dtype=torch.float64)  # slopes(16)[0::2][:4]
    torch.testing.assert_close(alibi_slopes(12)[8:], expected, rtol=1e-15, atol=0)
    assert torch.equal(alibi_slopes(np.int64(12)), alibi_slopes(12))  # a head count read from an array
    for bad in (0, 2.0, True, "4"):
        with pytest.raises(ValueError, match="positive integer"):
            alibi_slopes(bad)


def tiny(family="llama", heads=4, kv_heads=2, backend="eager", seed=0):
    overrides = (
        {} if heads == 4 else {"num_attention_heads": heads, "num_key_value_heads": kv_heads, "hidden_size": 16 * heads}
    )
    model = make_tiny(family, seed=seed, **overrides)
    hf_posenc.patch(model, "alibi", backend=backend)
    return model


def test_backends_are_registered_with_both_transformers_interfaces():
    for backend, name in zip(ALIBI.names, ALIBI.implementations, strict=True):
        assert name == f"hf_posenc_alibi_{backend}"
        assert name in ALL_ATTENTION_FUNCTIONS and name in ALL_MASK_ATTENTION_FUNCTIONS


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("heads", [4, 6])  # 6: not a power of two; both with grouped-query attention (2 kv heads)
def test_zero_query_key_makes_scores_pure_bias(backend, heads):
    """With q = k = 0 the logits are the bias alone: the output is softmax(-m_h (i - j)) over the real
    earlier tokens, applied to the values; computed here directly in float64, left padding included."""
    model = tiny(heads=heads, backend=backend)
    for layer in model.model.layers:
        layer.self_attn.q_proj.weight.data.zero_()
        layer.self_attn.k_proj.weight.data.zero_()
    ids = torch.randint(1, 97, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding: the first row's tokens sit at positions 0 .. 6
    seen = {}
    attention = model.model.layers[1].self_attn
    attention.register_forward_pre_hook(lambda m, a, kw: seen.update(hidden=kw["hidden_states"]), with_kwargs=True)
    attention.o_proj.register_forward_pre_hook(lambda m, a: seen.update(out=a[0]))
    with torch.no_grad():
        model(ids, attention_mask=mask)
        value = attention.v_proj(seen["hidden"]).double().view(2, 12, 2, 16)  # (B, T, H_kv, D)
    value = value.repeat_interleave(heads // 2, dim=2)  # query head h reads kv head h // groups
    position = mask.cumsum(-1)  # (B, T)
    distance = (position[:, :, None] - position[:, None, :]).double()  # (B, i, j)
    allowed = (torch.arange(12)[:, None] >= torch.arange(12)[None, :]) & mask[:, None, :].bool()
    slopes = torch.tensor(paper_slopes(heads), dtype=torch.float64)
    logits = -slopes[None, :, None, None] * distance[:, None]  # (B, H, i, j)
    weights = torch.softmax(logits.masked_fill(~allowed[:, None], -math.inf), dim=-1)
    expected = torch.einsum("bhij,bjhd->bihd", weights, value).reshape(2, 12, heads * 16)
    real = mask.bool()
    torch.testing.assert_close(seen["out"][real].double(), expected[real], rtol=0, atol=2e-6)


def test_rope_is_removed_and_logits_change():
    model = make_tiny("qwen3")
    ids = torch.randint(0, 97, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits
        hf_posenc.patch(model, "alibi")
        cos, sin = model.model.rotary_emb(torch.zeros(1, 20, 16), torch.arange(20)[None])
        after = model(ids).logits
    assert torch.equal(cos, torch.ones_like(cos)) and torch.equal(sin, torch.zeros_like(sin))
    assert (after - before).abs().max() > 1e-3


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_patch_and_unpatch_bit_for_bit(family):
    model = make_tiny(family, attn_implementation="sdpa")
    ids = torch.randint(0, 97, (2, 80), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference = model(ids).logits
    before = snapshot(model)
    hf_posenc.patch(model, "alibi")
    info = hf_posenc.get_patch(model)
    assert info.params == {"backend": "sdpa", "slopes": alibi_slopes(4).tolist()}  # auto -> sdpa on CPU
    assert model.config._attn_implementation == "hf_posenc_alibi_sdpa"
    assert model.config.hf_posenc["params"]["slopes"] == alibi_slopes(4).tolist()
    hf_posenc.unpatch(model)
    assert model.config._attn_implementation == "sdpa"
    assert_same(before, snapshot(model))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference)


def test_backends_agree_with_padding():
    ids = torch.randint(1, 97, (2, 40), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :9] = 0
    logits = {}
    for backend in BACKENDS:
        with torch.no_grad():
            logits[backend] = tiny("qwen2", backend=backend)(ids, attention_mask=mask).logits[mask.bool()]
    torch.testing.assert_close(logits["sdpa"], logits["eager"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits["flex"], logits["eager"], rtol=1e-5, atol=1e-5)


def test_switching_backend_through_transformers():
    model = tiny(backend="eager")
    ids = torch.randint(0, 97, (1, 30), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        eager = model(ids).logits
        model.set_attn_implementation("hf_posenc_alibi_sdpa")
        torch.testing.assert_close(model(ids).logits, eager, rtol=1e-5, atol=1e-5)


def test_leaving_the_alibi_implementations_is_an_error_not_a_silent_model_without_positions():
    model = tiny(backend="eager")
    ids = torch.randint(0, 97, (1, 30), generator=torch.Generator().manual_seed(4))
    model.set_attn_implementation("sdpa")
    with pytest.raises(
        RuntimeError,
        match="patched with 'alibi', but its attention implementation is now 'sdpa', which does not apply it",
    ):
        model(ids)
    model.set_attn_implementation("hf_posenc_alibi_eager")
    hf_posenc.unpatch(model)  # the check goes with the patch
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, make_tiny("llama")(ids).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cached_generation_equals_recomputation_past_the_context(backend):
    model = tiny("mistral", backend=backend)
    prompt = torch.randint(1, 97, (1, 30), generator=torch.Generator().manual_seed(5))
    sequence, cached = generate(model, prompt, new=60)
    assert sequence.shape[1] == 90 > model.config.max_position_embeddings
    steps = list(range(0, 60, 6))  # every 6th token, the last ones past L = 64: recomputing all is slow on CPU
    with torch.no_grad():
        recomputed = torch.stack([model(sequence[:, : 30 + t], use_cache=False).logits[:, -1] for t in steps], 1)
    torch.testing.assert_close(cached[:, steps], recomputed, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_left_padded_batch_generates_as_each_sequence_alone(backend):
    model = tiny("llama", backend=backend)
    long = torch.randint(1, 97, (1, 20), generator=torch.Generator().manual_seed(6))
    short = torch.randint(1, 97, (1, 13), generator=torch.Generator().manual_seed(7))
    assert_left_padded_batch_generates_as_each_alone(model, long, short)


def test_save_and_load_round_trip_and_plain_transformers_refuses(tmp_path):
    model = tiny("llama", backend="sdpa")
    ids = torch.randint(0, 97, (1, 100), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        logits = model(ids).logits
    model.save_pretrained(tmp_path / "alibi")
    saved = json.loads((tmp_path / "alibi" / "config.json").read_text())
    assert saved["rope_parameters"]["rope_type"] == "hf_posenc_alibi"
    assert saved["hf_posenc"]["params"] == {"backend": "sdpa", "slopes": alibi_slopes(4).tolist()}
    loaded = hf_posenc.from_pretrained(str(tmp_path / "alibi")).eval()
    assert hf_posenc.get_patch(loaded) == hf_posenc.get_patch(model)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, logits, rtol=0, atol=0)
    hf_posenc.unpatch(loaded)
    assert loaded.config._attn_implementation == "sdpa"
    assert loaded.config.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}
    torch.save(ids, tmp_path / "ids.pt")
    plain = plain_load(str(tmp_path / "ids.pt"), str(tmp_path / "alibi"))[str(tmp_path / "alibi")]
    assert plain.startswith("KeyError") and "hf_posenc_alibi" in plain


@pytest.mark.parametrize(
    ("family", "asked", "backend", "base"),
    [
        ("llama", "eager", "eager", "eager"),
        ("llama", "sdpa", "sdpa", "sdpa"),
        ("llama", "hf_posenc_alibi_eager", "eager", "eager"),
        ("gpt2", "flex_attention", "flex", "sdpa"),  # GPT-2 itself has no flex_attention
    ],
)
def test_attn_implementation_at_load_picks_the_alibi_backend(tmp_path, family, asked, backend, base):
    """``attn_implementation`` given to ``from_pretrained`` is honoured (not overridden by the saved backend):
    a standard name selects the ALiBi backend replacing it; ``unpatch`` leaves eager or SDPA."""
    model = tiny(family, backend="sdpa")
    ids = torch.randint(0, 97, (1, 60), generator=torch.Generator().manual_seed(8))
    model.save_pretrained(tmp_path)
    loaded = hf_posenc.from_pretrained(str(tmp_path), attn_implementation=asked).eval()
    assert loaded.config._attn_implementation == ALIBI.implementation(backend)
    assert hf_posenc.get_patch(loaded).params == {**hf_posenc.get_patch(model).params, "backend": backend}
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)
    hf_posenc.unpatch(loaded)
    assert loaded.config._attn_implementation == base


def test_attn_implementation_without_alibi_counterpart_is_refused(tmp_path):
    tiny("llama").save_pretrained(tmp_path)
    with pytest.raises(
        ValueError, match="'flash_attention_2' has no counterpart for this model's patch; use one of eager, sdpa"
    ):
        hf_posenc.from_pretrained(str(tmp_path), attn_implementation="flash_attention_2")


@pytest.mark.parametrize("backend", [*BACKENDS, "cudnn"])
def test_alibi_implementation_on_an_unpatched_model_says_so(backend):
    model = make_tiny("llama")
    model.set_attn_implementation(ALIBI.implementation(backend))
    with pytest.raises(RuntimeError, match="has no ALiBi slopes.*not ones switched to them by hand"):
        model(torch.randint(0, 97, (1, 8)))


def test_get_patch_reports_the_backend_running_now():
    model = tiny("llama", backend="eager")
    model.set_attn_implementation(ALIBI.implementation("sdpa"))
    assert hf_posenc.get_patch(model).params["backend"] == "sdpa"
    assert model.config.hf_posenc["params"]["backend"] == "eager"  # the saved config keeps the one asked for


@pytest.mark.parametrize("backend", ["auto", "flex"])
def test_the_config_records_the_backend_asked_for(tmp_path, backend):
    """``auto`` is chosen again where the model is loaded (a model saved from a GPU loads on a CPU); a backend
    asked for by name is kept. get_patch says which one runs."""
    model = tiny("llama", backend=backend)
    assert hf_posenc.get_patch(model).params["backend"] == ("sdpa" if backend == "auto" else backend)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["hf_posenc"]["params"]["backend"] == backend
    assert hf_posenc.get_patch(hf_posenc.from_pretrained(str(tmp_path))) == hf_posenc.get_patch(model)


@pytest.mark.parametrize(
    "rope_parameters",
    [
        {"rope_type": "linear", "factor": 2.0},
        {"rope_type": "dynamic", "factor": 2.0},
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
        {"rope_type": "yarn", "factor": 4.0},
    ],
    ids=lambda rope: rope["rope_type"],
)
def test_alibi_replaces_a_scaled_rope_too(tmp_path, rope_parameters):
    """ALiBi removes the rotation whatever scaled it (Llama 3.x ships rope_type llama3): the same logits as on
    the same weights with plain RoPE; unpatch and the saved config bring the scaled RoPE back."""
    rope = {**rope_parameters, "rope_theta": 10000.0, "original_max_position_embeddings": 32}
    scaled, plain = make_tiny("llama", rope_parameters=rope), make_tiny("llama")
    before = snapshot(scaled)
    for model in (scaled, plain):
        hf_posenc.patch(model, "alibi", backend="eager")
    ids = torch.randint(1, 97, (1, 80), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        logits = scaled(ids).logits
        torch.testing.assert_close(logits, plain(ids).logits, rtol=0, atol=0)
    hf_posenc.unpatch(scaled)
    assert_same(before, snapshot(scaled))
    hf_posenc.patch(scaled, "alibi", backend="eager").save_pretrained(tmp_path)
    loaded = hf_posenc.from_pretrained(str(tmp_path), attn_implementation="eager").eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, logits, rtol=0, atol=0)
    assert hf_posenc.unpatch(loaded).config.rope_parameters == before["config"]["rope_parameters"]


def _bloom():
    config = BloomConfig(vocab_size=97, hidden_size=32, n_layer=1, n_head=4)
    return AutoModelForCausalLM.from_config(config).eval()


def _falcon():  # rotary, but Falcon's attention does not go through the attention interface
    config = FalconConfig(vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, alibi=False)
    return AutoModelForCausalLM.from_config(config).eval()


def _gemma2():  # rotary, attention through the interface, but with soft-capped logits
    config = Gemma2Config(
        vocab_size=97, hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8,
    )  # fmt: skip
    return AutoModelForCausalLM.from_config(config).eval()


def _opt():
    config = OPTConfig(
        vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, ffn_dim=32, word_embed_proj_dim=32
    )
    return AutoModelForCausalLM.from_config(config).eval()


BAD = [
    ("unknown backend", lambda: make_tiny("llama"), {"backend": "cudnn-magic"}, ValueError, "Unknown ALiBi backend 'cudnn-magic'. Available backends: auto, eager, sdpa, flex, cudnn"),
    ("cudnn off CUDA", lambda: make_tiny("llama"), {"backend": "cudnn"}, ValueError, "cudnn backend cannot be used: it needs a CUDA device \\(this is cpu\\)"),
    ("cudnn, own slopes", lambda: make_tiny("llama"), {"backend": "cudnn", "slopes": [0.5, 0.25, 0.125, 0.0625]}, ValueError, "computes the paper's slopes itself, and these slopes differ"),
    ("wrong slope count", lambda: make_tiny("llama"), {"slopes": [0.5, 0.25]}, ValueError, "2 ALiBi slopes given; this model has 4 query heads"),
    ("negative slope", lambda: make_tiny("llama"), {"slopes": [0.5, -0.25, 0.1, 0.1]}, ValueError, "finite and > 0"),
    ("unknown parameter", lambda: make_tiny("llama"), {"factor": 4}, TypeError, "Unknown parameter.*'factor'.*Valid parameters: backend, slopes"),
    ("model already alibi", _bloom, {}, ValueError, r"encodes position as alibi \(attention bias\); method 'alibi' needs rotary embeddings \(RoPE\) or a learned"),
    ("learned but not gpt2", _opt, {}, ValueError, "learned positions of GPT-2 only.*'opt'"),
    ("rope, attention of its own", _falcon, {}, ValueError, "'alibi' replaces RoPE in llama, mistral, qwen2, qwen3 models.*'falcon'"),
    ("rope, soft-capped logits", _gemma2, {}, ValueError, "Gemma2ForCausalLM \\(model_type 'gemma2'\\) is not one of them"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "build", "params", "error", "match"), BAD, ids=[case[0] for case in BAD])
def test_bad_input_raises_and_changes_nothing(case, build, params, error, match):
    model = build()
    before = snapshot(model)
    with pytest.raises(error, match=match):
        hf_posenc.patch(model, "alibi", **params)
    assert hf_posenc.get_patch(model) is None
    assert_same(before, snapshot(model))


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fixed_shapes", [4, 0])  # prefills compiled for their shapes, or all dynamic
def test_flex_compiled_on_cuda_matches_eager(monkeypatch, dtype, fixed_shapes):
    monkeypatch.setattr(compiled_flex, "STATIC_PREFILLS", fixed_shapes)
    monkeypatch.setattr(compiled_flex, "_STATIC", compiled_flex.StaticPrefills())  # whatever ran before
    ids = torch.randint(1, 97, (2, 700), generator=torch.Generator().manual_seed(9)).cuda()
    mask = torch.ones_like(ids)
    mask[0, :123] = 0
    logits = {}
    for backend in ("eager", "flex"):
        model = make_tiny("llama", seed=0).to("cuda", dtype)
        hf_posenc.patch(model, "alibi", backend=backend)
        with torch.no_grad():
            logits[backend] = model(ids, attention_mask=mask).logits[mask.bool()].float()
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(logits["flex"], logits["eager"], rtol=tolerance, atol=tolerance)


@gpu
def test_flex_memory_is_linear_in_length():
    """32k tokens, 4 heads: an n x n float32 bias alone would be 16 GiB; flex must stay far below it."""
    model = make_tiny("llama").to("cuda", torch.bfloat16)
    hf_posenc.patch(model, "alibi", backend="flex")  # "auto" picks cudnn where the frontend is installed
    ids = torch.randint(0, 97, (1, 32768), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        model(ids, logits_to_keep=1)
    assert torch.cuda.max_memory_allocated() < 2 * 1024**3


@pytest.mark.parametrize("backend", BACKENDS)
def test_distances_count_real_tokens_only(backend):
    """Left padding leaves index distances right; a masked-out stretch inside a row does not. The row
    with tokens 5..8 masked must give the logits of the row without them: positions from the mask."""
    model = tiny("llama", backend=backend)
    ids = torch.randint(1, 97, (1, 30), generator=torch.Generator().manual_seed(10))
    mask = torch.ones_like(ids)
    mask[0, 5:9] = 0
    with torch.no_grad():
        holed = model(ids, attention_mask=mask).logits[mask.bool()]
        removed = model(ids[mask.bool()][None]).logits[0]
    torch.testing.assert_close(holed, removed, rtol=1e-5, atol=1e-5)


def test_gradients_agree_between_eager_and_sdpa():
    """Fine-tuning goes through the bias: the same loss and gradients from the reference and from SDPA."""
    ids = torch.randint(1, 97, (2, 24), generator=torch.Generator().manual_seed(11))
    mask = torch.ones_like(ids)
    mask[0, :6] = 0
    grads = {}
    for backend in ("eager", "sdpa"):
        model = tiny("qwen2", backend=backend).train()
        loss = model(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss  # token 6 from a pad row
        loss.backward()
        grads[backend] = torch.cat([model.model.layers[0].self_attn.q_proj.weight.grad.flatten(), loss[None]])
    assert grads["eager"].abs().max() > 0
    torch.testing.assert_close(grads["sdpa"], grads["eager"], rtol=1e-4, atol=1e-6)


def test_beam_search_with_cache_equals_without():
    model = tiny("llama", backend="sdpa")
    model.generation_config.eos_token_id = None
    prompt = torch.randint(1, 97, (2, 12), generator=torch.Generator().manual_seed(12))
    mask = torch.ones_like(prompt)
    mask[1, :3] = 0
    kwargs = dict(attention_mask=mask, max_new_tokens=20, num_beams=3, do_sample=False, pad_token_id=0)
    cached = model.generate(prompt, **kwargs)
    assert torch.equal(cached, model.generate(prompt, use_cache=False, **kwargs))


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("backend", [*BACKENDS, "cudnn"])  # cudnn off CUDA: its mask object, flex attention
def test_static_cache_generates_as_the_dynamic_cache(backend, padded, monkeypatch):
    """A static cache is longer than the sequence (keys past it are masked): distances must not change. With
    such a cache generate() prepares the masks itself: they must still be the ALiBi backend's masks. Without
    padding only the cache offsets bound the keys; the static cache advances its offset tensor in place
    before attention runs, so a mask that kept a reference to it would let each query see one empty slot."""
    monkeypatch.setattr(alibi_planner, "_fused_problem", lambda model, slopes: None)  # cudnn accepted on CPU
    model = tiny("llama", backend=backend)
    model.generation_config.eos_token_id = None
    prompt = torch.randint(1, 97, (2, 12), generator=torch.Generator().manual_seed(13))
    mask = torch.ones_like(prompt)
    mask[1, :4] = 0 if padded else 1
    kwargs = dict(attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=0)
    dynamic = model.generate(prompt, **kwargs)
    assert torch.equal(model.generate(prompt, cache_implementation="static", **kwargs), dynamic)
