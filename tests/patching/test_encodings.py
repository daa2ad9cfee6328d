"""NoPE and sinusoidal positions on real model classes (tiny random weights): what the forward computes, exact
unpatch, save -> load, plain transformers refusing the saved config, and bad input leaving the model untouched."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import assert_refused, plain_load
from tiny_models import make_tiny

import hf_posenc
from hf_posenc.methods.sinusoidal import sinusoidal_embedding

pytestmark = pytest.mark.usefixtures("one_thread")
ROPE_FAMILIES = ["llama", "mistral", "qwen2", "qwen3"]


def _ids(n: int, batch: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 97, (batch, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", ROPE_FAMILIES)
def test_nope_on_rope_is_the_model_with_zero_rotation(family):
    """NoPE = the unpatched model whose rotary frequencies are all zero (cos 1, sin 0), bit for bit; and unpatch
    gives the original logits back."""
    model = make_tiny(family)
    ids = _ids(90)  # past the 64 trained positions
    reference = copy.deepcopy(model)
    reference.model.rotary_emb.inv_freq.zero_()
    with torch.no_grad():
        original, expected = model(ids).logits, reference(ids).logits
        hf_posenc.patch(model, "nope")
        assert torch.equal(model(ids).logits, expected)
        assert not torch.equal(expected, original)
        hf_posenc.unpatch(model)
        assert torch.equal(model(ids).logits, original)


def test_nope_on_gpt2_is_the_model_with_a_zero_table_and_runs_past_it():
    model = make_tiny("gpt2")
    reference = copy.deepcopy(model)
    reference.transformer.wpe.weight.data.zero_()
    ids = _ids(64)
    with torch.no_grad():
        original = model(ids).logits
        hf_posenc.patch(model, "nope")
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=0, atol=0)
        long = model(_ids(150)).logits  # past n_positions = 64: wpe is never indexed there
        assert long.shape == (2, 150, 97) and bool(long.isfinite().all())
        hf_posenc.unpatch(model)
        assert torch.equal(model(ids).logits, original)


def test_sinusoidal_on_gpt2_adds_the_scaled_table_at_every_position():
    """The patched GPT-2 = the unpatched one whose wpe rows are scale * PE(p), for inputs of any length; the
    default scale gives the table the learned table's RMS."""
    model = make_tiny("gpt2")
    state = {key: value.clone() for key, value in model.state_dict().items()}
    wpe = state.pop("transformer.wpe.weight")
    hf_posenc.patch(model, "sinusoidal")
    scale = hf_posenc.get_patch(model).params["scale"]
    assert scale == pytest.approx(wpe.double().pow(2).mean().sqrt().item() * 2**0.5)
    ids = _ids(150)
    with torch.no_grad():
        patched = model(ids).logits
        hf_posenc.unpatch(model)
        reference = make_tiny("gpt2", n_positions=150)  # the same weights, and a longer table holding scale * PE
        reference.load_state_dict(state, strict=False)
        reference.transformer.wpe.weight.copy_(scale * sinusoidal_embedding(torch.arange(150), 64))
        torch.testing.assert_close(patched, reference(ids).logits, rtol=1e-5, atol=1e-5)
        assert torch.equal(model.transformer.wpe.weight, wpe)


def test_sinusoidal_scale_and_base_are_parameters():
    model = make_tiny("gpt2")
    hf_posenc.patch(model, "sinusoidal", scale=1, base=500)
    assert hf_posenc.get_patch(model).params == {"scale": 1.0, "base": 500.0}
    positions = torch.arange(10)[None]
    expected = sinusoidal_embedding(positions, 64, base=500).float()
    assert torch.equal(model.transformer.wpe(positions), expected)


@pytest.mark.parametrize(("family", "method"), [("llama", "nope"), ("gpt2", "nope"), ("gpt2", "sinusoidal")])
def test_saved_model_loads_through_hf_posenc_and_plain_transformers_refuses_it(tmp_path, family, method):
    """A saved patched model: hf_posenc.from_pretrained rebuilds it (same logits, unpatch gives the base); plain
    transformers raises rather than load the original encoding."""
    model = make_tiny(family)
    ids = _ids(40, batch=1)
    with torch.no_grad():
        base_logits = model(ids).logits
    hf_posenc.patch(model, method)
    folder = tmp_path / method
    model.save_pretrained(folder)
    loaded = hf_posenc.from_pretrained(str(folder), attn_implementation="eager").eval()
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert hf_posenc.get_patch(loaded) == hf_posenc.get_patch(model)
    hf_posenc.unpatch(loaded)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, base_logits)
    torch.save(ids, tmp_path / "ids.pt")
    plain = plain_load(str(tmp_path / "ids.pt"), str(folder))[str(folder)]
    marker = "hf_posenc_" + method
    assert plain.startswith("KeyError") and marker in plain


@pytest.mark.parametrize(
    ("family", "method", "params", "error", "match"),
    [
        ("llama", "sinusoidal", {}, ValueError, "method 'sinusoidal' needs a learned absolute position table"),
        ("gpt2", "sinusoidal", {"scale": 0}, ValueError, "scale must be > 0"),
        ("gpt2", "sinusoidal", {"scale": float("inf")}, ValueError, "scale must be finite"),
        ("gpt2", "sinusoidal", {"factor": 2}, TypeError, "Unknown parameter.*Valid parameters: scale, base"),
        ("gpt2", "sinusoidal", {"scale": 1e300}, ValueError, r"scale=1e\+300 makes the sinusoidal table overflow"),
        ("gpt2", "sinusoidal", {"base": 1}, ValueError, "base must be > 1 so that the wavelengths"),
        ("gpt2", "sinusoidal", {"base": 0.5}, ValueError, "base must be > 1"),
        (
            "llama",
            "nope",
            {"factor": 2},
            TypeError,
            r"Unknown parameter\(s\) 'factor' for method 'nope'. 'nope' takes no",
        ),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(family, method, params, error, match):
    assert_refused(make_tiny(family), method, params, error, match)


def test_nope_leaves_attention_alone_so_any_rope_decoder_takes_it():
    """Gemma 2 soft-caps its logits: a bias would be wrong there (refused), the identity rotation is not."""
    from transformers import AutoModelForCausalLM, Gemma2Config

    config = Gemma2Config(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
    model = AutoModelForCausalLM.from_config(config).eval()
    assert_refused(model, "t5-bias", {}, ValueError, "'t5-bias' replaces RoPE in llama, mistral")
    reference = copy.deepcopy(model)
    reference.model.rotary_emb.inv_freq.zero_()
    ids = _ids(20)
    hf_posenc.patch(model, "nope")
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)


@pytest.mark.parametrize(
    ("overrides", "method", "match"),
    [
        ({"n_embd": 63, "n_head": 3}, "sinusoidal", "The sinusoidal table needs an even width; this model's is 63"),
        ({"add_cross_attention": True}, "sinusoidal", r"GPT-2 with cross-attention \(add_cross_attention=True\)"),
        ({"add_cross_attention": True}, "nope", r"GPT-2 with cross-attention \(add_cross_attention=True\)"),
        ({"add_cross_attention": True}, "t5-bias", r"GPT-2 with cross-attention \(add_cross_attention=True\)"),
    ],
)
def test_gpt2_shapes_an_encoding_does_not_fit_are_refused_and_change_nothing(overrides, method, match):
    """sin/cos come in pairs (an odd width has no table); a GPT-2 with cross-attention has a second attention per
    layer that the encodings do not cover."""
    assert_refused(make_tiny("gpt2", **overrides), method, {}, ValueError, match)
