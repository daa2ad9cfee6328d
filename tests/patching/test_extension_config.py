"""The remaps (Self-Extend, DCA, STRING, ReRoPE, Leaky ReRoPE) and log-n (alone and combined): save / load round trips, what plain transformers and vLLM read
in the saved config, the attention implementation staying one that applies the method, bad input, and exact
unpatch. The KV cache and padding are in test_extension_cache.py."""

from __future__ import annotations

import json
import logging
import math
import pickle
import re

import pytest
import torch
from helpers import assert_refused, assert_same, plain_load, snapshot
from tiny_models import make_tiny
from transformers import AutoModelForCausalLM

import hf_posenc
from hf_posenc.attention import REMAP
from hf_posenc.methods.rerope import leaky_rerope_reach
from hf_posenc.registry import get_method

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
]


L = 64
SE = {"group_size": 4, "window": 16}
DCA = {"chunk_size": 48, "local_size": 4}
VLLM_KEY = "dual_chunk_attention_config"

# (family, method, params): every method and combination, over the four families.
METHODS = {
    "self-extend": ("llama", "self-extend", SE),
    "dca-qwen2": ("qwen2", "dca", DCA),
    "dca-defaults": ("llama", "dca", {}),
    "logn": ("mistral", "logn", {}),
    "logn-llama4": ("llama", "logn", {"variant": "llama4", "attn_scale": 0.5, "floor_scale": 16}),
    "self-extend+logn": ("qwen3", "self-extend+logn", {**SE, "backend": "eager"}),
    "yarn+logn": ("llama", "yarn+logn", {"factor": 2}),
    "dca+logn": ("qwen2", "dca+logn", DCA),
    "dynamic-ntk+logn": ("llama", "dynamic-ntk+logn", {"factor": 2}),
    "yarn+self-extend+logn": ("mistral", "yarn+self-extend+logn", {"factor": 2, **SE}),
    "string": ("qwen2", "string", {"shifted_offset": 44, "local_value": 8}),
    "rerope+logn": ("llama", "rerope+logn", {"window": 16}),
    "leaky-rerope": ("mistral", "leaky-rerope", {"window": 16, "k": 4.0}),
}


def tiny(family: str, implementation: str = "eager"):
    """Weights 2.5x the default scale: sharper attention, so every method moves the logits well past noise."""
    return make_tiny(family, attn_implementation=implementation, initializer_range=0.05)


def patched(case: str, implementation: str = "eager"):
    family, method, params = METHODS[case]
    return hf_posenc.patch(tiny(family, implementation), method, original_max_position_embeddings=L, **params)


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


IDS = torch.randint(1, 97, (1, 100), generator=torch.Generator().manual_seed(0))  # past L and DCA's chunk at 88


# Save and load.


@pytest.mark.parametrize("case", sorted(METHODS))
def test_save_and_load_round_trip_then_unpatch_gives_the_base(tmp_path, case):
    """from_pretrained gives the same patch and the same logits (bit for bit where the backend is the same; a remap
    loaded with attn_implementation="eager" runs its eager reference); unpatching the loaded model gives the
    unpatched model's logits bit for bit and its config values back."""
    family, method, _ = METHODS[case]
    base = tiny(family)
    reference = logits(base, IDS)
    model = patched(case)
    expected = logits(model, IDS)
    assert (expected - reference).abs().max() > 1e-2  # the method changes the model here
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["rope_parameters"]["rope_type"] == "hf_posenc_extension"
    assert saved["hf_posenc"]["method"] == method

    # "eager" builds the base with eager attention and, for a remap, selects its eager backend (the reference)
    loaded = hf_posenc.from_pretrained(str(tmp_path), attn_implementation="eager").eval()
    info, loaded_info = hf_posenc.get_patch(model), hf_posenc.get_patch(loaded)
    if "backend" in info.params:
        assert loaded_info.params == {**info.params, "backend": "eager"}
        torch.testing.assert_close(logits(loaded, IDS), expected, rtol=0, atol=1e-5)
    else:
        assert loaded_info == info
        assert loaded.config._attn_implementation == model.config._attn_implementation
        torch.testing.assert_close(logits(loaded, IDS), expected, rtol=0, atol=0)

    hf_posenc.unpatch(loaded)
    assert hf_posenc.get_patch(loaded) is None
    for key in ("rope_parameters", "max_position_embeddings", "_attn_implementation"):
        assert getattr(loaded.config, key) == getattr(base.config, key), key
    assert getattr(loaded.config, VLLM_KEY, None) is None and not hasattr(loaded.config, "hf_posenc")
    torch.testing.assert_close(logits(loaded, IDS), reference, rtol=0, atol=0)


def test_plain_transformers_refuses_every_saved_method(tmp_path):
    """Without hf_posenc, transformers raises KeyError naming the rope type instead of building the model
    without the method (which would run the plain model under a patched model's name)."""
    folders = []
    for case in sorted(METHODS):
        patched(case).save_pretrained(tmp_path / case)
        folders.append(str(tmp_path / case))
    torch.save(IDS, tmp_path / "ids.pt")
    outcome = plain_load(str(tmp_path / "ids.pt"), *folders)
    for folder in folders:
        assert outcome[folder].startswith("KeyError") and "hf_posenc_extension" in outcome[folder], folder
        with pytest.raises(KeyError, match="hf_posenc_extension"):  # with hf_posenc imported too
            AutoModelForCausalLM.from_pretrained(folder)


@pytest.mark.parametrize("case", ["dca-qwen2", "self-extend", "logn"])
def test_unpatched_after_loading_saves_the_base_config(tmp_path, case):
    """A model loaded with hf_posenc and unpatched saves the very config.json the base model saves: no key of the
    patch left behind (not even set to null)."""
    family = METHODS[case][0]
    tiny(family).save_pretrained(tmp_path / "base")
    patched(case).save_pretrained(tmp_path / "patched")
    loaded = hf_posenc.from_pretrained(str(tmp_path / "patched"), attn_implementation="eager")
    hf_posenc.unpatch(loaded).save_pretrained(tmp_path / "again")
    base = json.loads((tmp_path / "base" / "config.json").read_text())
    again = json.loads((tmp_path / "again" / "config.json").read_text())
    assert again == base, sorted(set(base) ^ set(again))


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (DCA, DCA),
        ({}, DCA),  # 3L/4, L/16
        (
            {"chunk_size": 30, "local_size": 6, "original_max_position_embeddings": 32},
            {"chunk_size": 30, "local_size": 6},
        ),
    ],
)
def test_dca_on_qwen2_writes_what_vllm_reads(tmp_path, params, expected):
    """vLLM reads Qwen2's DCA from ``dual_chunk_attention_config``: the resolved chunk_size and local_size, not the
    trained context (given it, vLLM scales the keys by a length temperature the paper's DCA does not have);
    unpatch removes the key again."""
    model = make_tiny("qwen2")
    hf_posenc.patch(model, "dca", **params)
    assert getattr(model.config, VLLM_KEY) == expected
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())[VLLM_KEY] == expected
    hf_posenc.unpatch(model)
    assert VLLM_KEY not in model.config.__dict__ and VLLM_KEY not in model.config.to_dict()


def test_dca_defaults_to_the_configs_own_dual_chunk_attention_config():
    """A Qwen2 config that ships vLLM's DCA keys (as Qwen2.5-1M does) gives DCA its chunk and local sizes; given
    parameters still win."""
    model = make_tiny("qwen2")
    model.config.dual_chunk_attention_config = {"chunk_size": 40, "local_size": 8}
    with hf_posenc.patched(model, "dca"):
        assert (
            hf_posenc.get_patch(model).params | {"chunk_size": 40, "local_size": 8} == hf_posenc.get_patch(model).params
        )
    with hf_posenc.patched(model, "dca", local_size=4):
        assert (hf_posenc.get_patch(model).params["chunk_size"], hf_posenc.get_patch(model).params["local_size"]) == (
            40,
            4,
        )
    assert model.config.dual_chunk_attention_config == {"chunk_size": 40, "local_size": 8}


@pytest.mark.parametrize(
    ("spec", "sizes"),
    [
        ("dca:original_max_position_embeddings=64", (40, 8)),
        ("yarn+dca:factor=2", (40, 8)),
        ("dca+logn", (40, 8)),
        ("yarn+dca:factor=2,chunk_size=32", (32, 8)),
    ],
)
def test_the_shipped_sizes_are_the_defaults_whatever_else_is_given(spec, sizes):
    """The config's own sizes stand in for those not given with L given, and in a combination (where L is resolved
    for both parts first), not the sizes L would give (48 and 4)."""
    model = make_tiny("qwen2")
    model.config.dual_chunk_attention_config = {"chunk_size": 40, "local_size": 8}
    with hf_posenc.patched(model, hf_posenc.MethodSpec.parse(spec)):
        params = hf_posenc.get_patch(model).params
        assert (params["chunk_size"], params["local_size"]) == sizes


@pytest.mark.parametrize(
    ("family", "method", "params"),
    [
        ("llama", "dca", DCA),
        ("qwen3", "dca", DCA),
        ("qwen2", "dca+logn", DCA),
        ("qwen2", "yarn+dca", {"factor": 2, **DCA}),
        ("qwen2", "self-extend", SE),
        ("qwen2", "logn", {}),
    ],
)
def test_no_vllm_dca_key_where_vllm_would_run_something_else(tmp_path, family, method, params):
    """Only DCA alone on Qwen2 gets vLLM's key: vLLM's dual chunk rotary takes the plain rope_theta and no log-n,
    so DCA with either would run there without it; other families and methods do not read it."""
    hf_posenc.patch(make_tiny(family), method, **params).save_pretrained(tmp_path)
    assert VLLM_KEY not in json.loads((tmp_path / "config.json").read_text())


def test_dca_on_a_config_scaled_natively_writes_no_vllm_key(tmp_path):
    """A Qwen2 config that ships a YaRN scaling: vLLM would build its DCA rotary on the plain rope_theta."""
    rope = {**make_tiny("qwen2").config.rope_parameters, "rope_type": "yarn", "factor": 2.0}
    model = make_tiny("qwen2", rope_parameters={**rope, "original_max_position_embeddings": L})
    hf_posenc.patch(model, "dca", **DCA).save_pretrained(tmp_path)
    assert VLLM_KEY not in json.loads((tmp_path / "config.json").read_text())


SHIPPED = {"chunk_size": 40, "local_size": 8, "original_max_position_embeddings": 48, "sparse_attention_enabled": False}


@pytest.mark.parametrize(
    ("method", "params"), [("yarn", {"factor": 2}), ("alibi", {}), ("self-extend", {"group_size": 2, "window": 8}),
                           ("yarn+dca", {"factor": 2}), ("dca+logn", {})]
)  # fmt: skip
def test_any_other_patch_of_a_config_shipping_vllms_dca_key_removes_it_and_restores_it(tmp_path, method, params):
    """vLLM builds DCA from ``dual_chunk_attention_config`` whenever a config has it, before it reads
    rope_parameters: a patch other than DCA alone saves it as null (vLLM then runs what rope_parameters say); the
    shipped L (48, not max_position_embeddings 64) is the trained context; unpatch and the saved record's base
    config give the shipped key back."""
    model = make_tiny("qwen2")
    model.config.dual_chunk_attention_config = dict(SHIPPED)
    hf_posenc.patch(model, method, **params)
    assert hf_posenc.get_patch(model).params.get("original_max_position_embeddings", 48) == 48  # ALiBi takes no L
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved[VLLM_KEY] is None
    assert saved["hf_posenc"]["base"][VLLM_KEY] == SHIPPED
    hf_posenc.unpatch(model)
    assert model.config.dual_chunk_attention_config == SHIPPED
    loaded = hf_posenc.from_pretrained(str(tmp_path), attn_implementation="eager")
    assert hf_posenc.get_patch(loaded).method == method
    assert hf_posenc.unpatch(loaded).config.dual_chunk_attention_config == SHIPPED


@pytest.mark.parametrize(("method", "params"), [("dca", DCA), ("yarn+dca", {"factor": 2, **DCA})])
def test_a_vllm_key_edited_by_hand_loads_without_an_edited_config_warning(tmp_path, caplog, method, params):
    """vLLM's DCA key edited in the saved config (for vLLM, or added for ``yarn+dca``): neither hf_posenc nor
    transformers builds the model from it, so the file loads as the record says, without a warning that the config
    disagrees with the record."""
    model = hf_posenc.patch(make_tiny("qwen2"), method, original_max_position_embeddings=L, **params)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config[VLLM_KEY] = {"chunk_size": 48, "local_size": 4, "original_max_position_embeddings": L}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING, logger="hf_posenc"):
        loaded = hf_posenc.from_pretrained(str(tmp_path), attn_implementation="eager")
    assert not [r for r in caplog.records if "disagrees" in r.getMessage()]
    assert hf_posenc.get_patch(loaded).method == method
    torch.testing.assert_close(logits(loaded, IDS), logits(model, IDS), rtol=0, atol=1e-5)


def test_dca_alone_on_a_config_shipping_the_key_writes_its_own_and_reads_the_shipped_l():
    model = make_tiny("qwen2")
    model.config.dual_chunk_attention_config = dict(SHIPPED)
    hf_posenc.patch(model, "dca")
    assert hf_posenc.get_patch(model).params["original_max_position_embeddings"] == 48
    assert model.config.dual_chunk_attention_config == {"chunk_size": 40, "local_size": 8}
    assert hf_posenc.unpatch(model).config.dual_chunk_attention_config == SHIPPED


def test_max_position_embeddings_is_self_extends_reach_or_the_one_asked():
    """Self-Extend writes its reach (L - W) * G + W, or the smaller max_position_embeddings asked for; DCA and
    log-n keep L."""
    assert hf_posenc.patch(make_tiny("llama"), "self-extend", **SE).config.max_position_embeddings == 208
    asked = hf_posenc.patch(make_tiny("llama"), "self-extend", **SE, max_position_embeddings=150)
    assert asked.config.max_position_embeddings == 150
    assert hf_posenc.get_patch(asked).params["max_position_embeddings"] == 150
    assert hf_posenc.patch(make_tiny("llama"), "dca", **DCA).config.max_position_embeddings == 64
    asked = hf_posenc.patch(make_tiny("llama"), "dca", **DCA, max_position_embeddings=1000)
    assert asked.config.max_position_embeddings == 1000
    assert hf_posenc.unpatch(asked).config.max_position_embeddings == 64
    assert hf_posenc.patch(make_tiny("llama"), "logn").config.max_position_embeddings == 64


def test_max_position_embeddings_is_the_reach_of_string_and_leaky_rerope():
    """STRING writes its reach L + S - W and Leaky ReRoPE w + 1 + floor(k (L - 1 - w)), or the length asked (up to
    the reach; Leaky ReRoPE then derives k from it); ReRoPE, which reaches any length, keeps L unless asked."""
    string = hf_posenc.patch(make_tiny("llama"), "string", shifted_offset=21, local_value=4)
    assert string.config.max_position_embeddings == 64 + 21 - 4
    with pytest.raises(ValueError, match=r"STRING's reach L \+ S - W = 81"):
        hf_posenc.patch(make_tiny("llama"), "string", shifted_offset=21, local_value=4, max_position_embeddings=82)
    leaky = hf_posenc.patch(make_tiny("llama"), "leaky-rerope", window=16, k=4)
    assert leaky.config.max_position_embeddings == 16 + 1 + 4 * 47
    asked = hf_posenc.get_patch(
        hf_posenc.patch(make_tiny("llama"), "leaky-rerope", window=15, max_position_embeddings=160)
    )
    assert asked.params["k"] == (160 - 1 - 15) / (64 - 1 - 15) == 3.0 and asked.params["max_position_embeddings"] == 160
    for context, target in [(8192, 131072), (4096, 4290), (64, 65), (64, 1000)]:  # float rounding would fall short
        derived = get_method("leaky-rerope").make_params(
            original_max_position_embeddings=context, max_position_embeddings=target
        )
        assert derived.reach >= target > leaky_rerope_reach(context, derived.window, math.nextafter(derived.k, 0))
    assert hf_posenc.patch(make_tiny("llama"), "rerope", window=16).config.max_position_embeddings == 64
    rerope = hf_posenc.patch(make_tiny("llama"), "rerope", window=16, max_position_embeddings=10_000)
    assert rerope.config.max_position_embeddings == 10_000


def _llama31_style(**overrides):
    """A tiny Llama shipping Llama 3.1's scaling: trained at 16 positions, served to max_position_embeddings 64."""
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # fmt: skip
    return make_tiny("llama", rope_parameters=rope, initializer_range=0.05, **overrides)


def test_on_a_base_shipping_a_scaling_l_is_the_context_it_serves():
    """Llama 3.1-style config (L_orig = 16, P = 64): L = 64, so Self-Extend reaches (64 - 8) * 2 + 8 = 120 rather
    than lowering P to (16 - 8) * 2 + 8 = 24; log-n leaves the 64 positions served bit for bit; DCA's defaults
    come from 64 (chunk 3L/4 = 48, local L/16 = 4). Given, original_max_position_embeddings still wins."""
    assert (
        hf_posenc.patch(_llama31_style(), "self-extend", group_size=2, window=8).config.max_position_embeddings == 120
    )
    given = hf_posenc.patch(
        _llama31_style(), "self-extend", group_size=2, window=8, original_max_position_embeddings=16
    )
    assert given.config.max_position_embeddings == 24
    model, ids = _llama31_style(), torch.randint(0, 97, (1, 64), generator=torch.Generator().manual_seed(0))
    before = logits(model, ids)
    hf_posenc.patch(model, "logn")
    assert hf_posenc.get_patch(model).params["original_max_position_embeddings"] == 64
    assert torch.equal(logits(model, ids), before)
    dca = hf_posenc.get_patch(hf_posenc.patch(_llama31_style(), "dca")).params
    assert (dca["chunk_size"], dca["local_size"]) == (48, 4)


@pytest.mark.parametrize("method", ["yarn+logn", "dynamic-ntk+logn", "pi+logn", "yarn+self-extend"])
def test_a_combination_on_gpt2_is_refused_as_its_parts_are(method):
    """GPT-2's learned positions: the part no planner serves on it is named (pi alone is GPT-2's resampling)."""
    part = "logn" if method.startswith("pi") else method.split("+")[0]
    assert_refused(make_tiny("gpt2"), method, {"factor": 2}, ValueError, rf"method '{part}' needs rotary embeddings")


@pytest.mark.parametrize(
    ("asked", "backend"),
    [
        ("hf_posenc_extension_eager", "eager"),
        ("hf_posenc_extension_blocked", "blocked"),
        ("hf_posenc_extension_flex", "flex"),
        ("sdpa", "sdpa"),  # a standard name other than eager and flex_attention selects a backend too
        ("flex_attention", "flex"),
    ],
)
def test_attn_implementation_at_load_naming_an_extension_backend(tmp_path, asked, backend):
    """As with ALiBi, an extension implementation named at load, or a standard name, selects that backend; the model
    runs, and unpatch leaves a standard implementation that runs without the patch (not the extension one, which
    needs it): eager after the eager backend, SDPA after the others."""
    model = hf_posenc.patch(tiny("llama", "eager"), "self-extend", original_max_position_embeddings=L, backend="eager")
    model.save_pretrained(tmp_path)
    loaded = hf_posenc.from_pretrained(str(tmp_path), attn_implementation=asked).eval()
    assert hf_posenc.get_patch(loaded).params["backend"] == backend
    assert loaded.config._attn_implementation == REMAP.implementation(backend)
    torch.testing.assert_close(logits(loaded, IDS), logits(model, IDS), rtol=1e-5, atol=1e-5)
    hf_posenc.unpatch(loaded)
    assert loaded.config._attn_implementation == ("eager" if backend == "eager" else "sdpa")
    logits(loaded, IDS)


@pytest.mark.parametrize(
    ("method", "asked"),
    [
        ("self-extend", "flash_attention_2"),
        ("self-extend", "hf_posenc_alibi_sdpa"),
        ("self-extend", "hf_posenc_logn_sdpa"),
        ("logn", "hf_posenc_alibi_eager"),
        ("logn", "hf_posenc_extension_sdpa"),
    ],
)
def test_attn_implementation_at_load_without_a_counterpart_is_refused(tmp_path, method, asked):
    """A name the patch cannot run (not silently the recorded backend) is a ValueError naming the ones it can,
    as for ALiBi."""
    hf_posenc.patch(tiny("llama"), method, original_max_position_embeddings=L).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=rf"attn_implementation='{asked}' has no counterpart .* use one of") as caught:
        hf_posenc.from_pretrained(str(tmp_path), attn_implementation=asked)
    copied = pickle.loads(pickle.dumps(caught.value))  # as an error crosses processes
    assert str(copied) == str(caught.value) and copied.standard == caught.value.standard


# The attention implementation must stay one that applies the method.


@pytest.mark.parametrize(
    ("case", "switched_to"),
    [
        ("self-extend", "sdpa"),
        ("self-extend", "eager"),
        ("dca-qwen2", "sdpa"),
        ("logn", "sdpa"),
        ("logn", "eager"),
        ("yarn+logn", "sdpa"),
        ("self-extend+logn", "sdpa"),
        ("self-extend", "hf_posenc_alibi_eager"),
        ("self-extend", "hf_posenc_logn_eager"),  # log-n's wrapper runs the model's attention: no remap
        ("dca+logn", "hf_posenc_logn_sdpa"),
        ("logn", "hf_posenc_extension_blocked"),  # a remap backend on a model without a remap
    ],
)
def test_leaving_the_implementations_that_apply_the_method_is_an_error(case, switched_to):
    """set_attn_implementation to one that does not apply the patch: a RuntimeError at the next forward naming
    the method, not a model silently without it (or a bare AttributeError)."""
    model = patched(case)
    model.set_attn_implementation(switched_to)
    with pytest.raises(RuntimeError, match=rf"patched with '{re.escape(METHODS[case][1])}'.*does not apply it"):
        logits(model, IDS)


def test_switching_between_implementations_that_apply_the_method():
    """A remap's backends are interchangeable through transformers, and so are log-n's wrappers of standard
    implementations: the same logits, and get_patch reports the remap backend running now."""
    model = patched("self-extend+logn")  # eager
    expected = logits(model, IDS)
    for backend in ("blocked", "sdpa", "flex", "eager"):
        model.set_attn_implementation(f"hf_posenc_extension_{backend}")
        assert hf_posenc.get_patch(model).params["backend"] == backend
        torch.testing.assert_close(logits(model, IDS), expected, rtol=1e-5, atol=1e-5)
    model = patched("logn")
    expected = logits(model, IDS)
    model.set_attn_implementation("hf_posenc_logn_sdpa")
    torch.testing.assert_close(logits(model, IDS), expected, rtol=1e-5, atol=1e-5)


# Bad input: a clear error, the model unchanged.


def _with_implementation(model, implementation: str):
    model.set_attn_implementation(implementation)
    return model


BAD = [
    ("window not a multiple of group_size", "llama", "self-extend", {"group_size": 4, "window": 18}, ValueError, r"window must be a multiple of group_size=4, got window=18"),
    ("window = L", "llama", "self-extend", {"group_size": 4, "window": 64}, ValueError, r"window must be below the trained context L=64, got 64"),
    ("window > L", "qwen3", "self-extend", {"group_size": 8, "window": 72}, ValueError, r"window must be below the trained context L=64, got 72"),
    ("default window holds no group", "llama", "self-extend", {"group_size": 32}, ValueError, r"default window L / 4 = 16 holds no whole group of group_size=32"),
    ("reach shorter than asked", "llama", "self-extend", {**SE, "max_position_embeddings": 209}, ValueError, r"reaches \(L - W\) \* G \+ W = 208 tokens, fewer than max_position_embeddings=209"),
    ("reach on the L given", "llama", "self-extend", {**SE, "original_max_position_embeddings": 32, "max_position_embeddings": 100}, ValueError, r"on L=32 reaches .* = 80 tokens"),
    ("reach asked below L", "llama", "self-extend", {**SE, "max_position_embeddings": 10}, ValueError, r"must be at least the trained context L=64, got 10"),
    ("group_size 0", "llama", "self-extend", {"group_size": 0}, ValueError, r"group_size"),
    ("unknown remap backend", "llama", "self-extend", {"backend": "cudnn"}, ValueError, r"Unknown backend 'cudnn'. Available backends: auto, eager, blocked, sdpa, flex"),
    ("chunk_size > L", "llama", "dca", {"chunk_size": 65}, ValueError, r"chunk_size must be at most the trained context L=64.*got 65"),
    ("local_size = chunk_size", "qwen2", "dca", {"chunk_size": 48, "local_size": 48}, ValueError, r"local_size must be below chunk_size=48"),
    ("local_size > default chunk_size", "llama", "dca", {"local_size": 50}, ValueError, r"local_size must be below chunk_size=48"),
    ("dca max_position_embeddings < L", "qwen2", "dca", {"max_position_embeddings": 63}, ValueError, r"max_position_embeddings \(the longest input to serve\) must be at least the trained context L=64, got 63"),
    ("string default W above S", "llama", "string", {}, ValueError, r"the default local_value 128 must be below shifted_offset=21 .*give local_value from 1 to 20"),
    ("string W = S", "llama", "string", {"shifted_offset": 20, "local_value": 20}, ValueError, r"local_value 20 must be below shifted_offset=20 .*equal, nothing moves"),
    ("string S = L", "llama", "string", {"shifted_offset": 64, "local_value": 8}, ValueError, r"shifted_offset must be below the trained context L=64, got 64"),
    ("string W > S", "qwen2", "string", {"shifted_offset": 20, "local_value": 21}, ValueError, r"local_value 21 must be below shifted_offset=20"),
    ("string W = 0", "llama", "string", {"shifted_offset": 20, "local_value": 0}, ValueError, r"local_value must be a positive integer, got 0"),
    ("string reach shorter than asked", "llama", "string", {"shifted_offset": 21, "local_value": 4, "max_position_embeddings": 82}, ValueError, r"STRING's reach L \+ S - W = 81"),
    ("string attention_factor 0", "llama", "string", {"shifted_offset": 21, "local_value": 4, "attention_factor": 0}, ValueError, r"attention_factor must be > 0"),
    ("rerope window = L", "llama", "rerope", {"window": 64}, ValueError, r"window must be below the trained context L=64, got 64"),
    ("rerope max_position_embeddings < L", "mistral", "rerope", {"max_position_embeddings": 32}, ValueError, r"must be at least the trained context L=64, got 32"),
    ("leaky k < 1", "llama", "leaky-rerope", {"k": 0.5}, ValueError, r"k must be a number from 1 \(RoPE itself\) to 2\^24, got 0.5"),
    ("leaky k huge", "llama", "leaky-rerope", {"k": 1e300}, ValueError, r"k must be a number from 1 \(RoPE itself\) to 2\^24, got 1e\+300"),
    ("leaky target past k = 2^24", "llama", "leaky-rerope", {"window": 8, "max_position_embeddings": 2**40}, ValueError, r"max_position_embeddings=1099511627776 needs k = 1.999e\+10 with window=8 on L=64, above 2\^24"),
    ("leaky window L - 1 past L", "llama", "leaky-rerope", {"window": 63, "max_position_embeddings": 100}, ValueError, r"window must be at most L - 2 = 62 for Leaky ReRoPE to reach past L=64"),
    ("leaky k inf", "llama", "leaky-rerope", {"k": float("inf")}, ValueError, r"k must be finite, got inf"),
    ("leaky reach shorter than asked", "llama", "leaky-rerope", {"window": 16, "k": 2, "max_position_embeddings": 112}, ValueError, r"reaches w \+ 1 \+ floor\(k \(L - 1 - w\)\) = 111 tokens, fewer than max_position_embeddings=112; use a larger k"),
    ("two remaps string rerope", "llama", "string+rerope", {}, ValueError, r"'string' and 'rerope' both change the remap"),
    ("dynamic scaling with rerope", "llama", "dynamic-ntk+rerope", {"factor": 2}, ValueError, r"'dynamic-ntk' changes the frequencies with the length"),
    ("unknown logn variant", "llama", "logn", {"variant": "mistral"}, ValueError, r"Unknown log-n variant 'mistral'. Available variants: qwen, llama4"),
    ("attn_scale with qwen", "llama", "logn", {"variant": "qwen", "attn_scale": 0.2}, ValueError, r"attn_scale belong to variant='llama4'"),
    ("floor_scale with qwen", "llama", "logn", {"floor_scale": 8}, ValueError, r"floor_scale belong to variant='llama4'"),
    ("backend for logn", "llama", "logn", {"backend": "eager"}, TypeError, r"Unknown parameter\(s\) 'backend' for method 'logn'"),
    ("factor for self-extend", "llama", "self-extend", {"factor": 2}, TypeError, r"Unknown parameter\(s\) 'factor' for method 'self-extend'"),
    ("combination parameter of no part", "llama", "self-extend+logn", {"factor": 2}, TypeError, r"Unknown parameter\(s\) 'factor'"),
    ("bad part parameter in a combination", "llama", "yarn+logn", {"factor": 2, "variant": "nope"}, ValueError, r"Unknown log-n variant 'nope'"),
    ("two remaps", "llama", "self-extend+dca", {}, ValueError, r"'self-extend' and 'dca' both change the remap"),
    ("alibi combined", "llama", "alibi+logn", {}, ValueError, r"'alibi' combine with nothing"),
    ("dynamic scaling with a remap", "llama", "dynamic-ntk+self-extend", {"factor": 2}, ValueError, r"'dynamic-ntk' changes the frequencies with the length"),
    ("dynamic-yarn with dca", "qwen2", "dynamic-yarn+dca", {}, ValueError, r"'dynamic-yarn' changes the frequencies with the length"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "family", "method", "params", "error", "match"), BAD, ids=[case[0] for case in BAD])
def test_bad_parameters_are_refused_and_change_nothing(case, family, method, params, error, match):
    assert_refused(make_tiny(family), method, params, error, match)


BAD_MODELS = [
    ("mistral with a sliding window", lambda: make_tiny("mistral", sliding_window=16), "logn", ValueError, r"uses sliding-window attention \(sliding_window=16\)"),
    ("qwen2 with a sliding layer", lambda: make_tiny("qwen2", sliding_window=16, use_sliding_window=True, layer_types=["full_attention", "sliding_attention"]), "dca", ValueError, r"uses sliding-window attention"),
    ("dynamic rope under a remap", lambda: make_tiny("llama", rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}), "self-extend", ValueError, r"need frequencies that do not change with the length.*\['dynamic'\]"),
    ("log-n over an implementation it does not wrap", lambda: _with_implementation(make_tiny("llama"), "hf_posenc_alibi_eager"), "logn", ValueError, r"'hf_posenc_alibi_eager' is not one it wraps; use one of eager, sdpa"),
    ("gpt2", lambda: make_tiny("gpt2"), "self-extend", ValueError, r"method 'self-extend' needs rotary embeddings"),
    ("gpt2 logn", lambda: make_tiny("gpt2"), "logn", ValueError, r"method 'logn' needs rotary embeddings"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "build", "method", "error", "match"), BAD_MODELS, ids=[case[0] for case in BAD_MODELS]
)
def test_models_the_methods_do_not_serve_are_refused_and_unchanged(case, build, method, error, match):
    assert_refused(build(), method, {}, error, match)


@pytest.mark.parametrize("use_sliding_window", [False, True])
def test_qwen2_with_no_sliding_layer_is_served(use_sliding_window):
    """Qwen2 configs carry a sliding_window that only the layers layer_types names use (none here, whatever
    use_sliding_window says, as with max_window_layers covering every layer): no refusal for it."""
    model = make_tiny("qwen2", sliding_window=16, use_sliding_window=use_sliding_window)
    assert model.config.layer_types == ["full_attention"] * 2
    hf_posenc.patch(model, "dca", **DCA)
    assert hf_posenc.get_patch(model).method == "dca"


# Unpatch: test_patching.py's bit-for-bit test runs over the RoPE scalings only (methods with frequencies).


def _pre_hooks(model) -> list[int]:
    return [len(module._forward_pre_hooks) for module in model.modules()]


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("case", sorted(METHODS))
def test_unpatch_restores_everything_bit_for_bit(case, implementation):
    """Config, tensors, module attributes, hooks and the attention implementation as before; the same logits,
    bit for bit; and a forward on sdpa afterwards (no check of the patch left behind)."""
    family, method, params = METHODS[case]
    model = tiny(family, implementation)
    reference = logits(model, IDS)
    before, hooks = snapshot(model), _pre_hooks(model)
    hf_posenc.patch(model, method, original_max_position_embeddings=L, **params)
    assert (logits(model, IDS) - reference).abs().max() > 1e-2
    assert hf_posenc.unpatch(model) is model
    assert hf_posenc.get_patch(model) is None
    assert_same(before, snapshot(model))
    assert _pre_hooks(model) == hooks and "create_masks_for_generate" not in model.__dict__
    assert model.config._attn_implementation == implementation
    assert torch.equal(logits(model, IDS), reference)
    model.set_attn_implementation("sdpa" if implementation == "eager" else "eager")
    logits(model, IDS)


def test_unpatch_after_switching_backend_gives_the_implementation_before_the_patch():
    model = tiny("llama", "sdpa")
    before = snapshot(model)
    hf_posenc.patch(model, "dca", **DCA)
    model.set_attn_implementation("hf_posenc_extension_eager")
    hf_posenc.unpatch(model)
    assert model.config._attn_implementation == "sdpa"
    assert_same(before, snapshot(model))


def test_patch_again_after_unpatch_gives_the_same_model():
    """patch, unpatch, patch: the second patch is the first (no state of the first one left over)."""
    model = patched("self-extend+logn")
    first, config = logits(model, IDS), model.config.to_dict()
    hf_posenc.unpatch(model)
    family, method, params = METHODS["self-extend+logn"]
    hf_posenc.patch(model, method, original_max_position_embeddings=L, **params)
    assert model.config.to_dict() == config
    assert torch.equal(logits(model, IDS), first)
