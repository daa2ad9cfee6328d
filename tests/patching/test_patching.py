"""patch / unpatch on tiny random models of each supported family."""

from __future__ import annotations

import logging
import re

import numpy as np
import paper_formulas as paper
import pytest
import torch
import transformers
from helpers import assert_same, method_params, snapshot
from tiny_models import make_tiny
from transformers import AutoModelForCausalLM, OPTConfig

import hf_posenc
from hf_posenc.registry import get_method, methods_for

L = 64  # the tiny models' max_position_embeddings
SEQ = 3 * L + 5  # past the trained context, so dynamic methods differ too


ROPE_SCALING = [name for name in hf_posenc.available_methods() if get_method(name).frequencies is not None]
ON_ROPE = methods_for("rope")


@pytest.fixture
def ids() -> torch.Tensor:
    return torch.randint(0, 97, (2, SEQ), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("method", ROPE_SCALING)
def test_patch_changes_logits_and_unpatch_restores_bit_for_bit(tiny_model, method, ids):
    pairs = tiny_model.model.rotary_emb.inv_freq.numel()
    with torch.no_grad():
        reference = tiny_model(ids).logits
    before = snapshot(tiny_model)
    assert hf_posenc.patch(tiny_model, method, **method_params(method, pairs)) is tiny_model
    with torch.no_grad():
        patched = tiny_model(ids).logits
    assert (patched - reference).abs().max() > 1e-3
    assert tiny_model.config.hf_posenc["method"] == method
    assert hf_posenc.unpatch(tiny_model) is tiny_model
    assert hf_posenc.get_patch(tiny_model) is None
    assert_same(before, snapshot(tiny_model))
    with torch.no_grad():
        assert torch.equal(tiny_model(ids).logits, reference)


def _paper(method: str, d: int, b: float, seq_len: int | None):
    return {
        "pi": lambda: paper.pi(d, b, L, 4),
        "ntk": lambda: paper.ntk(d, b, L, 4),
        "dynamic-ntk": lambda: paper.dynamic_ntk(d, b, L, 4, seq_len),
        "ntk-by-parts": lambda: (paper.by_parts(d, b, L, 4), 1.0),
        "yarn": lambda: paper.yarn(d, b, L, 4),
        "dynamic-yarn": lambda: paper.dynamic_yarn(d, b, L, seq_len),
        "llama3": lambda: paper.llama3(d, b, L, 4),
        "longrope": lambda: paper.longrope(d, b, L, 4, [1.0 + i / 4 for i in range(d // 2)], [1.0] * (d // 2), seq_len),
    }[method]()


@pytest.mark.parametrize("method", ROPE_SCALING)
@pytest.mark.parametrize("family", ["llama", "qwen3"])  # qwen3: head_dim set apart from hidden/heads
def test_patched_cos_sin_follow_the_papers(family, method):
    model = make_tiny(family)
    rotary = model.model.rotary_emb
    d, b = 2 * rotary.inv_freq.numel(), model.config.rope_parameters["rope_theta"]
    hf_posenc.patch(model, method, **method_params(method, d // 2))
    positions = torch.arange(16)[None]
    x = torch.zeros(1, 16, d)
    for seq_len in (16, SEQ):  # a short and a long forward: dynamic methods differ
        ids = torch.arange(seq_len)[None]
        cos, sin = rotary(x, ids)
        cos, sin = cos[:, :16].double(), sin[:, :16].double()
        inv_freq, factor = _paper(method, d, b, seq_len)
        expected = torch.tensor(inv_freq, dtype=torch.float64)
        torch.testing.assert_close(rotary.inv_freq.double(), expected, rtol=1e-6, atol=0)
        angles = positions[..., None].double() * expected  # (1, 16, d/2)
        torch.testing.assert_close(cos[..., : d // 2], angles.cos() * factor, rtol=0, atol=2e-6)
        torch.testing.assert_close(sin[..., d // 2 :], angles.sin() * factor, rtol=0, atol=2e-6)


def test_get_patch_reports_resolved_parameters(caplog):
    model = make_tiny("llama")
    assert hf_posenc.get_patch(model) is None
    with caplog.at_level(logging.INFO, logger="hf_posenc"):
        hf_posenc.patch(model, "yarn", factor=4)
    assert "using the config's max_position_embeddings = 64 as the trained context" in caplog.text
    info = hf_posenc.get_patch(model)
    assert info.method == "yarn" and info.native and info.rope_type == "yarn"
    assert info.params == {
        "original_max_position_embeddings": 64,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "ramp": "index",
        "truncate": True,
        "factor": 4.0,
        "attention_factor": pytest.approx(1.1386294361),
        "mscale": None,
        "mscale_all_dim": None,
    }
    hf_posenc.unpatch(model)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hf_posenc"):
        hf_posenc.patch(model, "linear", factor=2, original_max_position_embeddings=32)
    assert "trained context" not in caplog.text
    assert hf_posenc.get_patch(model).method == "pi"
    assert model.config.rope_parameters == {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}
    assert model.config.max_position_embeddings == 64


def test_patched_context_manager_restores_even_on_error(ids):
    model = make_tiny("qwen2")
    before = snapshot(model)
    with pytest.raises(KeyError, match="boom"), hf_posenc.patched(model, "dynamic-yarn") as inside:
        assert hf_posenc.get_patch(inside).method == "dynamic-yarn"
        raise KeyError("boom")
    assert hf_posenc.get_patch(model) is None
    assert_same(before, snapshot(model))


def test_two_models_do_not_affect_each_other(ids):
    first, second = make_tiny("llama"), make_tiny("llama")
    with torch.no_grad():
        reference = second(ids).logits
        hf_posenc.patch(first, "yarn", factor=4)
        hf_posenc.patch(make_tiny("llama"), "dynamic-ntk", factor=2)
        assert torch.equal(second(ids).logits, reference)
        assert not torch.equal(first(ids).logits, reference)


def test_sdpa_and_eager_agree_when_patched(ids):
    eager, sdpa = make_tiny("llama"), make_tiny("llama", attn_implementation="sdpa")
    for model in (eager, sdpa):
        hf_posenc.patch(model, "yarn", factor=4)
    with torch.no_grad():
        torch.testing.assert_close(eager(ids).logits, sdpa(ids).logits, rtol=1e-4, atol=1e-4)


BAD = [
    ("unknown method", "rope-magic", {"factor": 2}, ValueError, "Unknown method 'rope-magic'. Available methods: alibi, dca, dynamic-ntk"),
    ("factor zero", "yarn", {"factor": 0}, ValueError, "factor must be >= 1"),
    ("factor nan", "pi", {"factor": float("nan")}, ValueError, "finite"),
    ("factor string", "ntk", {"factor": "x"}, TypeError, "factor must be a number, got str: 'x'. Valid"),
    ("factor below one", "pi", {"factor": 0.5}, ValueError, "shrink"),
    ("beta order", "yarn", {"factor": 4, "beta_fast": 1, "beta_slow": 2}, ValueError, "beta_fast must be greater"),
    ("longrope length", "longrope", {"factor": 4, "long_factor": [1.0, 2.0]}, ValueError, "long_factor has 2 values; this model's rotary dimension 16 needs 8"),
    ("unknown parameter", "pi", {"factor": 4, "scale": 2}, TypeError, "Unknown parameter.*'scale'"),
    ("bad context", "pi", {"factor": 4, "original_max_position_embeddings": 0}, ValueError, "positive integer"),
]  # fmt: skip


def test_numpy_scalars_are_numbers_and_the_config_stays_json(tmp_path):
    model = make_tiny("llama")
    hf_posenc.patch(model, "yarn", factor=np.float32(4), original_max_position_embeddings=np.int64(64))
    params = hf_posenc.get_patch(model).params
    assert (params["factor"], params["original_max_position_embeddings"]) == (4.0, 64)
    assert type(params["factor"]) is float and type(params["original_max_position_embeddings"]) is int
    model.save_pretrained(tmp_path)  # json.dumps of the config


def test_ntk_on_a_two_dimensional_rotation_is_a_clear_error():
    model = make_tiny("llama", head_dim=2)
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"rotary dimension d > 2 \(its exponent is d/\(d-2\)\), got 2"):
        hf_posenc.patch(model, "dynamic-ntk", factor=2)
    assert_same(before, snapshot(model))


@pytest.mark.parametrize(("case", "method", "params", "error", "match"), BAD, ids=[case[0] for case in BAD])
def test_bad_input_raises_and_changes_nothing(tiny_model, case, method, params, error, match, ids):
    before = snapshot(tiny_model)
    with pytest.raises(error, match=match):
        hf_posenc.patch(tiny_model, method, **params)
    assert hf_posenc.get_patch(tiny_model) is None
    assert_same(before, snapshot(tiny_model))


def test_gpt2_error_names_what_applies():
    model = make_tiny("gpt2")
    before = snapshot(model)
    with pytest.raises(
        ValueError,
        match=r"model_type 'gpt2'\) encodes position as learned \(transformer.wpe\).*Methods for learned positions: alibi, nope, pi, sinusoidal, t5-bias\.",
    ):
        hf_posenc.patch(model, "yarn", factor=4)
    assert_same(before, snapshot(model))


@pytest.mark.parametrize("method", ["alibi", "t5-bias"])
def test_a_learned_table_other_than_gpt2s_is_told_what_hf_posenc_patches(method):
    """A BERT decoder (a learned table, no rotary module, not a listed family): the methods that replace positions
    name what they patch, not only what the model lacks."""
    config = transformers.BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, is_decoder=True)  # fmt: skip
    model = transformers.BertLMHeadModel(config)
    before = snapshot(model)
    with pytest.raises(ValueError, match="patches rotary embeddings, and GPT-2's learned position table"):
        hf_posenc.patch(model, method)
    assert_same(before, snapshot(model))


def test_opt_error_names_no_method_since_none_applies():
    config = OPTConfig(
        vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, ffn_dim=32, word_embed_proj_dim=32
    )
    with pytest.raises(
        ValueError,
        match=r"encodes position as learned .*No registered method patches learned positions of 'opt' models yet\.",
    ):
        hf_posenc.patch(AutoModelForCausalLM.from_config(config), "yarn", factor=4)


def test_patching_twice_raises_and_keeps_the_first_patch(ids):
    model = make_tiny("mistral")
    hf_posenc.patch(model, "yarn", factor=4)
    before = snapshot(model)
    with pytest.raises(RuntimeError, match="already patched with 'yarn'; call hf_posenc.unpatch"):
        hf_posenc.patch(model, "pi", factor=2)
    assert_same(before, snapshot(model))
    assert hf_posenc.get_patch(model).method == "yarn"


def test_unpatching_an_unpatched_model_raises():
    model = make_tiny("llama")
    before = snapshot(model)
    with pytest.raises(RuntimeError, match="not patched"):
        hf_posenc.unpatch(model)
    assert_same(before, snapshot(model))


def test_already_scaled_model_is_refused():
    model = make_tiny("llama", rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})
    with pytest.raises(ValueError, match="already uses rope_type 'linear'"):
        hf_posenc.patch(model, "yarn", factor=4)


def test_unpatch_follows_a_device_or_dtype_move(ids):
    model = make_tiny("llama")
    original = model.model.rotary_emb.inv_freq.clone()
    hf_posenc.patch(model, "ntk", factor=4)
    model.to(torch.float64)
    hf_posenc.unpatch(model)
    restored = model.model.rotary_emb.inv_freq
    assert restored.dtype == torch.float64 and torch.equal(restored, original.double())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("method", ["yarn", "longrope", "dynamic-ntk"])
def test_unpatch_after_a_cast_there_and_back_gives_what_the_casts_give_the_unpatched_model(method, dtype, ids):
    """``model.to(bfloat16).to(float32)`` rounds every float tensor of the unpatched model through bfloat16: after
    a patch, unpatch gives the saved frequencies that rounding too (a dynamic method's, updated per call, stay
    as saved when no such rounding explains them)."""
    reference = make_tiny("llama").to(dtype).to(torch.float32)
    model = hf_posenc.patch(make_tiny("llama"), method, **method_params(method, 8))
    model.to(dtype).to(torch.float32)
    hf_posenc.unpatch(model)
    assert_same(snapshot(reference), snapshot(model))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("method", ["nope", "alibi", "t5-bias", "dynamic-ntk", "dynamic-yarn", "longrope"])
def test_a_cast_there_and_back_is_followed_whatever_the_patch_installed(method, dtype, ids):
    """The round trip rounds what unpatch gives back, and a forward between it and unpatch changes nothing: the
    tensors a patch replaces stay on their module, cast with the model. The values the patch left cannot tell a
    round trip: nope's, ALiBi's and the T5 bias's zero frequencies and a dynamic method's per-call ones (after a
    forward) do not show it, so unpatch would give the frequencies unrounded, and within L dynamic NTK and YaRN
    would use them so, no longer the unpatched model."""
    reference = make_tiny("llama").to(dtype).to(torch.float32)
    model = hf_posenc.patch(make_tiny("llama"), method, **method_params(method, 8))
    model.to(dtype).to(torch.float32)
    with torch.no_grad():
        if get_method(method).unchanged_within_context:
            assert torch.equal(model(ids[:, : L - 4]).logits, reference(ids[:, : L - 4]).logits)
        model(ids)
    hf_posenc.unpatch(model)
    assert_same(snapshot(reference), snapshot(model))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("method", [name for name in ROPE_SCALING if get_method(name).dynamic])
def test_dynamic_patch_follows_a_dtype_cast(method, dtype, ids):
    """``model.to(dtype)`` after a dynamic patch rounds its per-call frequencies as it rounds the unpatched
    model's: within L dynamic NTK / YaRN stay the unpatched model, and unpatch after a forward past L gives
    the cast model back exactly."""
    reference = make_tiny("llama").to(dtype)
    model = make_tiny("llama")
    hf_posenc.patch(model, method, **method_params(method, 8))
    model.to(dtype)
    with torch.no_grad():
        if get_method(method).unchanged_within_context:
            assert torch.equal(model(ids[:, : L - 4]).logits, reference(ids[:, : L - 4]).logits)
        model(ids)
    assert model.model.rotary_emb.inv_freq.dtype == dtype
    hf_posenc.unpatch(model)
    assert_same(snapshot(reference), snapshot(model))


def test_trained_context_recorded_by_the_config_is_used(caplog):
    model = make_tiny("llama")
    model.config.original_max_position_embeddings = 32  # Phi-3 style: recorded outside rope_parameters
    with caplog.at_level(logging.WARNING, logger="hf_posenc"):
        hf_posenc.patch(model, "yarn", factor=2)
    assert "trained context" not in caplog.text
    assert hf_posenc.get_patch(model).params["original_max_position_embeddings"] == 32


@pytest.mark.parametrize(("given", "warned"), [(64, False), (32, False), (10**6, True)])
def test_a_trained_context_above_the_configs_is_patched_with_a_warning(caplog, given, warned):
    """``L`` is the context the model was trained at, which its config does not exceed: a larger one (a typo, an
    extra zero) patches as asked, but says so (YaRN x4 at L=10**6 leaves every frequency of a 64-token model)."""
    model = make_tiny("llama")
    with caplog.at_level(logging.WARNING, logger="hf_posenc"):
        hf_posenc.patch(model, "yarn", factor=4, original_max_position_embeddings=given)
    expected = f"original_max_position_embeddings={given} is above the config's max_position_embeddings=64"
    assert (expected in caplog.text) == warned
    assert hf_posenc.get_patch(model).params["original_max_position_embeddings"] == given


GENERIC = {
    "gpt_neox": lambda T: T.GPTNeoXConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64, rotary_pct=0.5),
    "phi": lambda T: T.PhiConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64, partial_rotary_factor=0.5),
    "gemma": lambda T: T.GemmaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64),
    # head_dim null, as Mixtral's configs have it: transformers' own yarn and dynamic functions fail on it
    "mixtral": lambda T: T.MixtralConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, num_local_experts=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
}  # fmt: skip


@pytest.mark.parametrize("model_type", sorted(GENERIC))
def test_other_rope_decoders_are_patched_by_the_same_code(model_type, ids):
    """Not in the architecture table: found by their rotary module (GPT-NeoX and Phi rotate only half the head)."""
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(GENERIC[model_type](transformers)).eval()
    rotary = next(m for m in model.modules() if "inv_freq" in m._buffers)
    d = 2 * rotary.inv_freq.numel()
    with torch.no_grad():
        reference = model(ids).logits
    before = snapshot(model)
    hf_posenc.patch(model, "yarn", factor=4)
    inv_freq, _ = paper.yarn(d, 10000.0, L, 4)
    torch.testing.assert_close(rotary.inv_freq.double(), torch.tensor(inv_freq, dtype=torch.float64), rtol=1e-6, atol=0)
    with torch.no_grad():
        assert (model(ids).logits - reference).abs().max() > 1e-3
    hf_posenc.unpatch(model)
    assert_same(before, snapshot(model))


@pytest.mark.parametrize("method", ["yarn", "ntk-by-parts", "dynamic-ntk"])
def test_where_transformers_function_fails_on_the_config_the_method_is_recorded_as_ours(method, caplog, tmp_path, ids):
    """Mixtral's ``head_dim: null`` makes transformers' yarn and dynamic functions raise a TypeError: the patch
    records hf_posenc's own type (saying why), computes the paper's frequencies, and saves and loads back."""
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(GENERIC["mixtral"](transformers)).eval()
    assert model.config.head_dim is None
    with caplog.at_level(logging.WARNING, logger="hf_posenc"):
        hf_posenc.patch(model, method, factor=4)
    assert "fails on this config (TypeError: " in caplog.text
    info = hf_posenc.get_patch(model)
    assert not info.native and info.rope_type.startswith("hf_posenc")
    expected, _ = hf_posenc.rope_frequencies(
        method, head_dim=16, base=10000.0, original_max_position_embeddings=L, factor=4
    )
    inv_freq = model.model.rotary_emb.inv_freq.double()
    torch.testing.assert_close(inv_freq, expected.to(inv_freq), rtol=1e-6, atol=0)
    model.save_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(hf_posenc.from_pretrained(tmp_path).eval()(ids).logits, model(ids).logits)


def tiny_phi3():
    import transformers

    config = transformers.Phi3Config(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("method", ["yarn", "pi", "dynamic-ntk", "llama3", "dynamic-yarn"])
def test_rope_types_the_config_class_refuses_are_refused_at_patch_time(method):
    """Phi-3's config accepts only rope types default and longrope, and transformers validates it on save:
    a patch it would refuse there is refused here, before the model changes."""
    model = tiny_phi3()
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"Phi3Config refuses the config that method .* could not be saved"):
        hf_posenc.patch(model, method, **method_params(method, 8))
    assert_same(before, snapshot(model))


@pytest.mark.parametrize("method", ["ntk", "longrope"])
def test_rope_types_the_config_class_accepts_save_and_load(method, tmp_path, ids):
    model = hf_posenc.patch(tiny_phi3(), method, **method_params(method, 8))
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_phi3_longrope_at_a_trained_context_other_than_its_class_default(tmp_path, ids):
    """Phi3Config keeps ``original_max_position_embeddings`` at the top level too (4096 unless set), and
    transformers reads L there first: a given L = 32 is written there as well, so the patch is native, plain
    transformers loads the same model, and unpatch gives the 4096 back."""
    model = tiny_phi3()
    before = snapshot(model)
    assert model.config.original_max_position_embeddings == 4096
    params = {"original_max_position_embeddings": 32, **method_params("longrope", 8)}
    hf_posenc.patch(model, "longrope", **params)
    assert hf_posenc.get_patch(model).native and model.config.original_max_position_embeddings == 32
    hf_posenc.unpatch(model)
    assert_same(before, snapshot(model))
    hf_posenc.patch(model, "longrope", **params).save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    long_ids = torch.randint(1, 97, (1, 40), generator=torch.Generator().manual_seed(1))  # past L: long factors
    with torch.no_grad():
        for inputs in (ids, long_ids):
            assert torch.equal(loaded(inputs).logits, model(inputs).logits)


def test_per_layer_type_rope_is_refused_clearly():
    config = transformers.Gemma3TextConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64)  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(config)
    before = snapshot(model)
    with pytest.raises(ValueError, match="no rotary-embedding module hf_posenc can patch.*Gemma 3"):
        hf_posenc.patch(model, "yarn", factor=4)
    assert_same(before, snapshot(model))


@pytest.mark.parametrize("method", ON_ROPE)
def test_transformers_weight_init_rebuilds_the_patched_frequencies(method):
    """transformers' _init_weights recomputes rotary buffers from module.rope_type and the config."""
    model = make_tiny("llama")
    hf_posenc.patch(model, method, **method_params(method, 8))
    rotary = model.model.rotary_emb
    before = rotary.inv_freq.clone()
    model._init_weights(rotary)
    torch.testing.assert_close(rotary.inv_freq, before, rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    ("family", "method"),
    [("llama", name) for name in ON_ROPE] + [("gpt2", name) for name in methods_for("learned")],
)
def test_the_resolved_parameters_patch_the_same_model(family, method):
    """The eval runner patches once to resolve a method on the model, then again from ``get_patch(...).params``:
    both give the same report, config (methods with a backend record the one chosen instead of 'auto') and
    logits."""
    model = make_tiny(family, seed=3)
    ids = torch.randint(0, 97, (1, 96), generator=torch.Generator().manual_seed(0))  # past L = 64
    with hf_posenc.patched(model, method, **method_params(method, 8)):
        first, config, logits = hf_posenc.get_patch(model), model.config.to_dict(), model(ids).logits
    with hf_posenc.patched(model, method, **first.params):
        assert hf_posenc.get_patch(model) == first
        again = model.config.to_dict()
        if "backend" in first.params:  # the record keeps the backend asked for ("auto"), get_patch the one chosen
            config["hf_posenc"]["params"]["backend"] = first.params["backend"]
        assert again == config
        assert torch.equal(model(ids).logits, logits)


def test_unpatch_of_a_patched_model_loaded_without_hf_posenc_says_how_to_unpatch_it(tmp_path):
    """A saved YaRN model loads with plain transformers (native): unpatch names the cause and the way (not "not
    patched by hf_posenc", which its config contradicts), and changes nothing; a model never patched is told so."""
    hf_posenc.patch(make_tiny("llama"), "yarn", factor=4).save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    before = snapshot(loaded)
    with pytest.raises(
        RuntimeError,
        match=r"neither patched nor loaded this model object .*load it with hf_posenc\.from_pretrained\(\.\.\.\)",
    ):
        hf_posenc.unpatch(loaded)
    assert_same(before, snapshot(loaded))
    with pytest.raises(RuntimeError, match="is not patched by hf_posenc; there is nothing to unpatch"):
        hf_posenc.unpatch(make_tiny("llama"))


@pytest.mark.parametrize("spec", ["yarn:factor=4", "yarn+logn:factor=4"])
def test_a_method_spec_given_to_patch_is_told_apart(spec):
    """patch takes a name and parameters; a spec string from the command line gets the call that means it."""
    model = make_tiny("llama")
    name = spec.partition(":")[0]
    with pytest.raises(ValueError, match=rf"is a method spec .*patch\(model, '{re.escape(name)}', param=value\)"):
        hf_posenc.patch(model, spec)
    assert hf_posenc.get_patch(model) is None


def test_a_module_without_a_config_is_refused_by_name():
    """A module that is not a transformers model is a TypeError naming its class, not ``AttributeError: 'Linear'
    object has no attribute 'config'``."""
    with pytest.raises(TypeError, match=r"patches a transformers model .*, not a Linear\.$"):
        hf_posenc.patch(torch.nn.Linear(2, 2), "yarn", factor=2)


def test_the_library_notes_its_assumptions_at_info_only(caplog):
    """A patch that assumes the trained context (none given, none recorded) says so at INFO: a program's log stays
    quiet unless it asks; nothing at WARNING, and the patch itself is logged at DEBUG."""
    with caplog.at_level(logging.DEBUG, logger="hf_posenc"):
        hf_posenc.patch(make_tiny("llama"), "yarn", factor=2)
    levels = {record.levelno for record in caplog.records if record.name.startswith("hf_posenc")}
    notes = [r for r in caplog.records if "original_max_position_embeddings not given" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelno == logging.INFO
    assert levels <= {logging.DEBUG, logging.INFO}


def test_a_model_that_does_not_take_the_implementation_is_left_as_it_was(monkeypatch):
    """transformers only warns where it cannot set a model's attention implementation: the patch then refuses, and
    the model is as it was."""
    model = make_tiny("llama")
    before = snapshot(model)
    monkeypatch.setattr(type(model), "set_attn_implementation", lambda self, name: None)
    with pytest.raises(RuntimeError, match="transformers did not select the attention implementation 'hf_posenc_"):
        hf_posenc.patch(model, "alibi")
    assert hf_posenc.get_patch(model) is None
    assert_same(before, snapshot(model))


@pytest.mark.parametrize(("method", "params"), [("yarn", {"factor": 4}), ("pi", {"factor": 2}), ("alibi", {})])
def test_a_dry_runs_config_is_the_patched_models(method, params):
    """``DryRun.config`` reads as the patched model's config (the keys other readers read written as a patch writes
    them, not through transformers' ``rope_scaling`` alias), the model unchanged."""
    from hf_posenc.patching import dry_run

    model = make_tiny("llama")
    config = dry_run(model, method, **params).config(model.config)
    assert hf_posenc.get_patch(model) is None
    hf_posenc.patch(model, method, **params)
    assert config.to_dict() == model.config.to_dict()
