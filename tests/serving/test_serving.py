"""What serving engines build from configs hf_posenc saves: the verdicts of hf_posenc.serving.engines, and every number in
them computed again here from the formulas (YaRN's 0.1 ln s + 1, dynamic NTK's base, LongRoPE's attention factor)."""

from __future__ import annotations

import dataclasses
import json
import logging
import math

import pytest
from tiny_models import make_tiny
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import hf_posenc
from hf_posenc.patching.rope_types import OWN_ROPE_TYPES
from hf_posenc.serving.engines import ENGINES, SEVERITIES, engine_findings

D, L, BASE = 16, 64, 10000.0  # the tiny models: head_dim 64 / 4 heads, max_position_embeddings 64, rope_theta 1e4


def saved_config(tmp_path, method: str, family: str = "llama", **params) -> dict:
    """The config.json that save_pretrained writes for a tiny ``family`` model patched with ``method``."""
    hf_posenc.patch(make_tiny(family), method, **params).config.save_pretrained(tmp_path)
    return json.loads((tmp_path / "config.json").read_text())


def verdicts(config: dict) -> dict[str, tuple[str, str]]:
    return {finding.engine: (finding.severity, finding.message) for finding in engine_findings(config)}


def yarn_factor(s: float, mscale: float = 1.0) -> float:
    """YaRN §3.4, sqrt(1/t) = 0.1 mscale ln s + 1."""
    return 0.1 * mscale * math.log(s) + 1


def dynamic_ntk_base(length: int, s: float = 4.0) -> float:
    """transformers' dynamic NTK at ``length`` tokens past L: b (s l / L - (s - 1))^(d / (d - 2))."""
    return BASE * (s * length / L - (s - 1)) ** (D / (D - 2))


def test_yarn_is_built_alike_everywhere(tmp_path):
    found = verdicts(saved_config(tmp_path, "yarn", factor=4))
    assert set(found) == {engine.name for engine in ENGINES}  # no "config" line: both dicts and rope_theta agree
    for severity, message in found.values():
        assert severity == "ok" and f"attention factor {yarn_factor(4):.4f}" in message and "L=64" in message


def test_ntk_by_parts_says_its_attention_factor_to_the_readers_of_the_mscale_pair(tmp_path):
    """hf_posenc writes ``mscale = mscale_all_dim = 1`` beside ``attention_factor = 1``: SGLang and TGI, which never
    read ``attention_factor``, compute 1 from the pair; llama.cpp's runtime overwrites it with YaRN's default."""
    config = saved_config(tmp_path, "ntk-by-parts", factor=4)
    assert (config["rope_parameters"]["mscale"], config["rope_parameters"]["mscale_all_dim"]) == (1.0, 1.0)
    found = verdicts(config)
    for engine in ("vllm", "sglang", "tgi"):
        assert found[engine][0] == "ok" and "attention factor 1.0000" in found[engine][1], engine
    assert found["llama.cpp"] == (
        "differs",
        f"YaRN s=4: attention factor {yarn_factor(4):.4f} where transformers uses 1.0000",
    )
    for key in ("rope_parameters", "rope_scaling"):  # a config that gives attention_factor alone (another tool's)
        del config[key]["mscale"], config[key]["mscale_all_dim"]
    assert verdicts(config)["sglang"][0] == verdicts(config)["tgi"][0] == "differs"


@pytest.mark.parametrize("attention", [1.05, 1.3])
def test_a_given_attention_factor_is_written_as_an_mscale_ratio_that_gives_it(tmp_path, attention):
    config = saved_config(tmp_path, "yarn", factor=4, attention_factor=attention)
    rope = config["rope_parameters"]
    ratio = (0.1 * rope["mscale"] * math.log(4) + 1) / (0.1 * rope["mscale_all_dim"] * math.log(4) + 1)
    assert ratio == pytest.approx(attention, rel=1e-12) and rope["attention_factor"] == attention
    assert verdicts(config)["sglang"][0] == "ok"


def test_the_deepseek_mscale_ratio_is_written_as_given(tmp_path):
    config = saved_config(tmp_path, "yarn", factor=4, mscale=1.0, mscale_all_dim=0.5)
    assert (config["rope_parameters"]["mscale"], config["rope_parameters"]["mscale_all_dim"]) == (1.0, 0.5)
    ratio = yarn_factor(4) / yarn_factor(4, 0.5)
    found = verdicts(config)
    for engine in ("vllm", "sglang", "tgi"):
        assert found[engine][0] == "ok" and f"attention factor {ratio:.4f}" in found[engine][1], engine


@pytest.mark.parametrize("model_type", ["deepseek_v2", "deepseek_v3"])
def test_llama_cpps_deepseek_graph_moves_the_mscale_into_the_softmax_scale(tmp_path, model_type):
    """llama.cpp's DeepSeek-V2 graph turns q and k with a factor of 1 (llama-context.cpp takes mscale =
    mscale_all_dim) and multiplies the softmax scale by (0.1 mscale_all_dim ln s + 1)^2, as transformers' DeepseekV2:
    the same model where transformers' rotation factor, the mscale ratio, is 1 (DeepSeek-V2's 0.707 / 0.707)."""
    config = {**saved_config(tmp_path, "yarn", factor=40, mscale=0.707, mscale_all_dim=0.707), "model_type": model_type}
    assert verdicts(config)["llama.cpp"] == (
        "ok",
        "builds YaRN s=40, L=64, attention factor 1.0000 as transformers does",
    )
    assert verdicts({**config, "model_type": "llama"})["llama.cpp"][1].endswith(
        f"attention factor {yarn_factor(40):.4f} where transformers uses 1.0000"
    )
    other = {**saved_config(tmp_path, "yarn", factor=4, mscale=1.0, mscale_all_dim=0.5), "model_type": model_type}
    ratio = yarn_factor(4) / yarn_factor(4, 0.5)
    assert verdicts(other)["llama.cpp"][1].endswith(f"attention factor 1.0000 where transformers uses {ratio:.4f}")


def test_tgi_refuses_yarn_and_llama3_without_l_in_rope_scaling_and_a_null_mscale(tmp_path):
    """TGI's static() reads rope_scaling["original_max_position_embeddings"] (KeyError without it, where transformers
    takes the top-level one) and uses a present mscale as a number."""
    for method in ("yarn", "llama3"):
        config = saved_config(tmp_path / method, method, factor=4)
        del config["rope_scaling"]["original_max_position_embeddings"]
        config["original_max_position_embeddings"] = L
        found = verdicts(config)
        assert found["tgi"] == (
            "refused",
            f"{method}: reads original_max_position_embeddings from rope_scaling (KeyError)",
        )
        assert found["vllm"][0] == "ok"
    config = saved_config(tmp_path / "null", "yarn", factor=4)
    config["rope_scaling"].update(mscale=None, mscale_all_dim=None)
    found = verdicts(config)
    assert found["tgi"] == ("refused", "yarn: mscale null is used as a number (TypeError)")
    assert found["vllm"] == (
        "ok",
        f"builds YaRN s=4, L={L}, attention factor {yarn_factor(4):.4f} as transformers does",
    )


def test_default_yarn_writes_no_mscale_pair(tmp_path):
    assert "mscale" not in saved_config(tmp_path, "yarn", factor=4)["rope_parameters"]


def test_engines_that_fix_the_ramp_differ_on_other_betas_and_on_truncate(tmp_path):
    found = verdicts(saved_config(tmp_path, "yarn", factor=4, beta_fast=16, truncate=False))
    assert found["vllm"][0] == found["sglang"][0] == "ok"
    for engine in ("llama.cpp", "tgi"):
        assert found[engine][0] == "differs"
        assert "betas fixed at 32/1 (config: 16.0/1.0)" in found[engine][1] and "truncate false" in found[engine][1]


def test_dynamic_ntk_is_one_fixed_base_in_vllm_and_sglang_and_absent_from_llama_cpp(tmp_path):
    config = saved_config(tmp_path, "dynamic-ntk", factor=4)
    found, at_4l = verdicts(config), dynamic_ntk_base(4 * L)
    assert found["vllm"][0] == "differs" and found["vllm"][1].startswith(f"one rope_theta {BASE:g} at every length")
    assert f"{at_4l:.6g} at 256" in found["vllm"][1] and "default max_model_len is 256" in found["vllm"][1]
    assert found["sglang"][0] == "differs" and found["sglang"][1].startswith(f"one rope_theta {at_4l:.6g} ")
    assert found["tgi"][0] == "differs" and f"rope_theta {at_4l:.6g}" in found["tgi"][1]
    assert found["llama.cpp"][0] == "ignored" and f"plain RoPE (rope_theta {BASE:g})" in found["llama.cpp"][1]
    for key in ("rope_parameters", "rope_scaling"):  # vLLM's own key: its base at P / max_trained_positions
        config[key]["max_trained_positions"] = 16
    assert verdicts(config)["vllm"][1].startswith(f"one rope_theta {BASE * (4 * 64 / 16 - 3) ** (D / (D - 2)):.6g} ")


def test_linear_is_lost_in_tgi_and_gives_a_longer_default_context_in_vllm(tmp_path):
    found = verdicts(saved_config(tmp_path, "pi", factor=4))  # max_position_embeddings = 4 L = 256
    assert found["vllm"][0] == found["sglang"][0] == found["llama.cpp"][0] == "ok"
    assert found["vllm"][1].endswith("= 256 x 4 = 1024")
    assert found["tgi"][0] == "ignored" and "static() sets no scaling factor" in found["tgi"][1]


def test_llama3_and_static_ntk_are_built_alike_everywhere(tmp_path):
    assert {severity for severity, _ in verdicts(saved_config(tmp_path / "l3", "llama3", factor=4)).values()} == {"ok"}
    mistral = verdicts(saved_config(tmp_path / "m3", "llama3", "mistral", factor=4))
    assert {severity for severity, _ in mistral.values()} == {"ok"}
    granite = {**saved_config(tmp_path / "l3", "llama3", factor=4), "model_type": "granite"}  # a Llama-class converter
    assert verdicts(granite)["llama.cpp"][0] == "ok"
    found = verdicts(saved_config(tmp_path / "ntk", "ntk", factor=4))
    theta = BASE * 4 ** (D / (D - 2))  # NTK-aware: b s^(d/(d-2)), written as rope_theta
    assert all(severity == "ok" and f"rope_theta {theta:g}" in message for severity, message in found.values())


def test_llama3s_l_is_the_rope_dicts_in_llama_cpps_converter_else_the_top_levels_else_8192(tmp_path):
    """conversion/llama.py computes llama3's rope_freqs factors with the rope dict's original_max_position_embeddings,
    which conversion/base.py fills from the top level when the dict has none (8192 without either; read in
    llama-cpp-python 0.3.36's vendored source). A dict-only L is taken as it is, not said to give 8192."""
    config = saved_config(tmp_path, "llama3", factor=4)
    assert config["original_max_position_embeddings"] == config["rope_scaling"]["original_max_position_embeddings"] == L
    del config["original_max_position_embeddings"]
    assert verdicts(config)["llama.cpp"][0] == "ok"  # the dict's
    for key in ("rope_scaling", "rope_parameters"):
        del config[key]["original_max_position_embeddings"]
    assert verdicts({**config, "original_max_position_embeddings": L})["llama.cpp"][0] == "ok"  # the top level's
    config["max_position_embeddings"] = 8 * L  # transformers then takes L = P
    assert verdicts(config)["llama.cpp"] == (
        "differs",
        "llama3: the converter computes its rope_freqs factors with L = 8192 (the rope dict's "
        f"original_max_position_embeddings, else the top level's, else 8192) where transformers uses {8 * L}",
    )
    for key in ("rope_scaling", "rope_parameters"):
        config[key]["original_max_position_embeddings"] = 8192  # Llama 3.1's: right by default
    assert verdicts(config)["llama.cpp"][0] == "ok"


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_llama3_outside_llama_and_mistral_is_converted_unscaled_by_llama_cpp(tmp_path, family):
    """llama.cpp's converter writes llama3's per-pair factors (the rope_freqs tensor) in its Llama class only: a
    Qwen2 or Qwen3 GGUF comes out with plain RoPE (checked by running the converter of llama-cpp-python 0.3.36)."""
    found = verdicts(saved_config(tmp_path, "llama3", family, factor=4))
    assert found["llama.cpp"][0] == "ignored" and f"no rope_freqs factors for {family!r}" in found["llama.cpp"][1]
    assert found["vllm"][0] == found["sglang"][0] == found["tgi"][0] == "ok"


@pytest.mark.parametrize("model_type", ["gemma", "gemma2", "gpt_neox", "phi", "stablelm"])
@pytest.mark.parametrize(("method", "params"), [("yarn", {"factor": 4}), ("pi", {"factor": 4}), ("ntk", {"factor": 4})])
def test_families_whose_converter_writes_no_rope_keys_are_plain_rope_in_llama_cpp(tmp_path, model_type, method, params):
    """llama.cpp's Gemma, Gemma 2, GPT-NeoX, Phi(-2) and StableLM converters write neither rope.freq_base nor
    rope.scaling (their set_gguf_parameters does not call the base class's; run on saved configs): the GGUF has
    plain RoPE at base 10000, NTK's new base lost too: not "ok", nor "differs" on the attention factor alone."""
    config = {**saved_config(tmp_path, method, **params), "model_type": model_type}
    severity, message = verdicts(config)["llama.cpp"]
    assert severity == "ignored" and f"its {model_type} converter writes no RoPE base or scaling" in message
    make_tiny("llama").config.save_pretrained(tmp_path / "base")
    unpatched = {**json.loads((tmp_path / "base" / "config.json").read_text()), "model_type": model_type}
    assert verdicts(unpatched)["llama.cpp"][0] == "ok"


def test_a_gemma_patched_is_warned_of_llama_cpps_plain_rope():
    from transformers import AutoModelForCausalLM, GemmaConfig

    config = GemmaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64)  # fmt: skip
    unpatched = json.loads(config.to_json_string())
    assert verdicts(unpatched)["llama.cpp"][0] == "ok"  # base 10000 unscaled: what its GGUF has
    model = hf_posenc.patch(AutoModelForCausalLM.from_config(config), "yarn", factor=4)
    gaps = [(f.engine, f.severity) for f in engine_findings(model.config.to_dict()) if f.severity != "ok"]
    assert gaps == [("llama.cpp", "ignored")]


def test_a_phi3_config_without_a_top_level_l_has_its_class_default(tmp_path):
    """Phi3Config (transformers 4 and 5) defaults the top-level original_max_position_embeddings to 4096 and reads
    L there first: a Phi-3 config without it is L = 4096 for transformers, vLLM, SGLang and TGI (not refused)."""
    config = saved_config(tmp_path, "longrope", factor=4, long_factor=[1.0 + i for i in range(D // 2)])
    del config["original_max_position_embeddings"]
    found = verdicts({**config, "model_type": "phi3"})
    assert found["tgi"][0] == "differs" and f"= {4 * L}/4096" in found["tgi"][1]
    assert "short factors up to 4096 tokens" in found["vllm"][1]
    assert "refused" in verdicts(config)["tgi"]  # a Llama config has no such default


def test_longrope_announces_the_extended_context_so_the_engines_compute_its_attention_factor(tmp_path):
    """vLLM, SGLang and TGI take LongRoPE's attention factor from ``max_position_embeddings / L``: hf_posenc writes
    ``round(s L)`` there (as Phi-3 configs do), so they compute transformers' value."""
    config = saved_config(tmp_path, "longrope", factor=4, long_factor=[1.0 + i for i in range(D // 2)])
    hf = math.sqrt(1 + math.log(4) / math.log(L))  # LongRoPE's default attention factor
    assert config["max_position_embeddings"] == 4 * L
    found = verdicts(config)
    assert f"attention factor {hf:.4f} from max_position_embeddings / L = 256/64" in found["vllm"][1]
    assert found["llama.cpp"][0] == "ignored" and "Phi-3" in found["llama.cpp"][1]
    phi3 = verdicts({**config, "model_type": "phi3"})["llama.cpp"]  # its converter writes the factor tensors
    assert phi3[0] == "differs" and f"attention factor {hf:.4f} from max_position_embeddings / L = 256/64" in phi3[1]
    assert "long factors at every position when the context (n_ctx) > 64" in phi3[1]
    config["max_position_embeddings"] = L  # P = L in the config: the engines compute 1
    for engine in ("vllm", "sglang", "tgi"):
        assert (
            f"attention factor 1.0000 from max_position_embeddings / L = 64/64 (transformers: {hf:.4f})"
            in (verdicts(config)[engine][1])
        ), engine


def test_a_config_with_only_rope_parameters_is_plain_rope_for_readers_of_rope_scaling(tmp_path):
    config = saved_config(tmp_path, "yarn", factor=4)
    del config["rope_scaling"], config["rope_theta"]  # what transformers 5 alone saves
    found = verdicts(config)
    assert found["config"] == (
        "ignored",
        "only rope_parameters says yarn: readers of rope_scaling (transformers 4.x, TGI) build plain RoPE",
    )
    assert found["tgi"][0] == "ignored" and found["tgi"][1].startswith("reads no rope_scaling: plain RoPE")
    assert found["vllm"][0] == found["sglang"][0] == found["llama.cpp"][0] == "ok"


def test_a_rope_theta_only_in_rope_parameters_is_lost_to_readers_of_the_top_level(tmp_path):
    config = saved_config(tmp_path, "ntk", factor=4)
    del config["rope_theta"]
    theta = BASE * 4 ** (D / (D - 2))
    found = verdicts(config)
    assert found["config"][0] == "differs" and f"rope dict {theta:g}" in found["config"][1]
    assert found["tgi"] == (
        "differs",
        f"rope_theta 10000 (from no rope_scaling or the top level); transformers 5 reads rope_parameters: {theta:g}",
    )
    assert found["vllm"][0] == "ok"


def test_disagreeing_rope_scaling_and_rope_parameters(tmp_path):
    config = saved_config(tmp_path, "yarn", factor=4)
    config["rope_scaling"] = {"type": "linear", "rope_type": "linear", "factor": 4.0}
    found = verdicts(config)
    assert found["config"][0] == "differs" and "disagree (linear / yarn)" in found["config"][1]
    assert found["vllm"][0] == "ok" and "linear x4" in found["vllm"][1]  # transformers 5 builds rope_scaling's
    assert found["llama.cpp"] == (
        "differs",
        "reads yarn from rope_parameters; transformers 5 reads rope_scaling: linear",
    )
    config["rope_scaling"]["type"] = "yarn"
    assert verdicts(config)["vllm"] == (
        "refused",
        "rope_scaling has type 'yarn' and rope_type 'linear': ValueError on loading",
    )


@pytest.mark.parametrize("method", ["dynamic-yarn", "alibi", "self-extend"])
def test_hf_posencs_own_types_are_refused_except_by_llama_cpp_which_drops_them(tmp_path, method):
    found = verdicts(saved_config(tmp_path, method))
    assert {found[engine][0] for engine in ("vllm", "sglang", "tgi")} == {"refused"}
    assert found["llama.cpp"][0] == "ignored" and "is unknown to it: plain RoPE" in found["llama.cpp"][1]


def test_dca_is_read_by_vllm_and_sglang_without_an_attention_backend(tmp_path):
    found = verdicts(saved_config(tmp_path, "dca", family="qwen2"))
    sizes = f"chunk_size {3 * L // 4}, local_size {L // 16}"  # the defaults: 3L/4 and L/16
    assert found["vllm"][0] == found["sglang"][0] == "refused"
    assert sizes in found["vllm"][1] and "no attention backend" in found["sglang"][1]
    assert "0.5.23 registers no dual_chunk_flash_attn backend" in found["sglang"][1]
    assert found["tgi"][0] == "refused" and found["llama.cpp"][0] == "ignored"
    releases = {finding.engine: finding.release for finding in engine_findings(saved_config(tmp_path, "dca"))}
    assert releases == {engine.name: engine.release for engine in ENGINES}  # each verdict names what it was read from
    assert releases["vllm"] == "vllm 0.34.0" and releases["sglang"] == "sglang 0.5.23"


def test_a_gpt2_config_without_rope(tmp_path):
    """llama.cpp's GPT-2 converter indexes ``n_ctx`` (conversion/gpt2.py), which transformers 5 saves for no GPT-2:
    refused there before anything else; with the key, the config alone is read as every other engine reads it."""
    config = saved_config(tmp_path / "pi", "pi", family="gpt2", factor=2)  # baked into wpe
    assert "n_ctx" not in config
    gpt2 = make_tiny("gpt2")
    gpt2.config.n_ctx = 64  # as GPT-2's released configs say it, and llama.cpp's converter reads the context from
    hf_posenc.patch(gpt2, "pi", factor=2).config.save_pretrained(tmp_path / "n_ctx")
    assert json.loads((tmp_path / "n_ctx" / "config.json").read_text())["n_ctx"] == 128  # not a stale 64
    found = verdicts(config)
    assert {found[engine][0] for engine in ("vllm", "sglang", "tgi")} == {"ok"}
    assert found["llama.cpp"] == ("refused", "its gpt2 converter reads n_ctx (KeyError: not in this config)")
    assert {severity for severity, _ in verdicts({**config, "n_ctx": 1024}).values()} == {"ok"}
    found = verdicts(saved_config(tmp_path / "sin", "sinusoidal", family="gpt2"))
    assert found["vllm"][0] == found["tgi"][0] == found["llama.cpp"][0] == "refused" and found["sglang"][0] == "ignored"


def test_llama_cpp_refuses_a_yarn_config_without_its_trained_context():
    """Its converter indexes ``original_max_position_embeddings`` in the rope dict, where it mirrors the top-level one
    (conversion/base.py), and transformers 5 (and vLLM, SGLang) fall back to ``max_position_embeddings``. hf_posenc
    always writes it in both. A config with L at the top level only is not refused."""
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "max_position_embeddings": 256,
        "original_max_position_embeddings": 64,
        "rope_theta": 10000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
    }
    found = verdicts(config)
    assert found["llama.cpp"][0] == "ok" and "L=64" in found["llama.cpp"][1]
    assert found["tgi"][0] == "refused" and found["vllm"][0] == "ok" and "L=64" in found["vllm"][1]
    del config["original_max_position_embeddings"]
    found = verdicts(config)
    assert found["llama.cpp"][0] == "refused" and "(KeyError)" in found["llama.cpp"][1]
    assert found["vllm"][0] == "ok" and "L=256" in found["vllm"][1]
    config["rope_scaling"]["original_max_position_embeddings"] = 64
    assert {severity for severity, _ in verdicts(config).values()} == {"ok"}


def test_every_engine_says_how_it_builds_each_rope_type_hf_posenc_writes():
    native = {"default", "linear", "dynamic", "yarn", "llama3", "longrope"}  # the Methods table of the README
    assert native <= set(ROPE_INIT_FUNCTIONS) - set(OWN_ROPE_TYPES) | {"default"}
    for engine in ENGINES:
        assert set(engine.builds) == native, engine.name
        assert engine.version and engine.doc and engine.unknown in SEVERITIES and engine.activation in SEVERITIES


def test_a_config_must_be_an_object():
    with pytest.raises(TypeError, match="JSON object, got a list"):
        engine_findings([])


def test_old_rope_type_names_are_read_as_every_reader_reads_them():
    """Phi-3's ``su`` is ``longrope`` to every engine, Qwen2-VL's ``mrope`` plain RoPE with sections."""
    phi3 = {"model_type": "phi3", "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
            "rope_scaling": {"type": "su", "long_factor": [1.0] * 48, "short_factor": [1.0] * 48}}  # fmt: skip
    assert [f.severity for f in engine_findings(phi3)] == ["differs"] * 4  # llama.cpp's Phi-3 converter reads su
    assert all(f.severity != "refused" for f in engine_findings({"rope_scaling": {"type": "mrope"}}))


def test_patch_only_patches_and_says_nothing_of_serving_engines(caplog):
    """The engines' verdicts are computed where they are used (``check``, the card): a patch neither logs them
    nor carries them in what ``get_patch`` reports."""
    with caplog.at_level(logging.DEBUG, logger="hf_posenc"):
        model = hf_posenc.patch(make_tiny("llama"), "dynamic-ntk", factor=4)
    assert not [r for r in caplog.records if "engine" in r.getMessage()]
    assert "serving" not in {field.name for field in dataclasses.fields(hf_posenc.get_patch(model))}
    assert [(f.engine, f.severity) for f in engine_findings(model.config.to_dict())] == [
        ("vllm", "differs"), ("sglang", "differs"), ("llama.cpp", "ignored"), ("tgi", "differs")
    ]  # fmt: skip
