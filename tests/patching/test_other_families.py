"""Families outside the architecture table whose configs change what a RoPE patch may do: an ALiBi switch
(Falcon), per-layer RoPE bases (GraniteSWA), an attention that reads the RoPE parameters (DeepSeek-V3), a config
class that accepts few rope types (Phi-3). Each patch is exact against plain transformers or refused untouched."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from helpers import assert_refused
from transformers import AutoConfig, AutoModelForCausalLM

import hf_posenc
from hf_posenc.architectures import rotary_modules
from hf_posenc.serving.engines import engine_findings

L = 64
SMALL = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=L)


def build(model_type: str, **fields) -> torch.nn.Module:
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **SMALL, **fields)
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


def ids(length: int = 3 * L) -> torch.Tensor:
    return torch.randint(3, 97, (1, length), generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize(
    ("method", "params"),
    [("yarn", {"factor": 4}), ("dynamic-ntk", {"factor": 4}), ("pi", {"factor": 4}), ("nope", {}), ("alibi", {})],
)
def test_falcon_with_its_alibi_switch_is_refused_as_an_alibi_model(method, params):
    """falcon-rw-1b/7b: ``alibi: true`` makes Falcon's attention add ALiBi and never use the rotary module it still
    builds, so a RoPE method there would change nothing (it would patch, report native, and leave the logits)."""
    model = build("falcon", alibi=True, new_decoder_architecture=False, multi_query=False)
    assert_refused(model, method, params, ValueError, r"encodes position as alibi \(the config's alibi: true\)")


def granite_swa(bases: list[float], meta: bool = False) -> torch.nn.Module:
    config = AutoConfig.for_model(
        "granite_swa",
        **SMALL,
        intermediate_size=96,
        num_key_value_heads=2,
        layer_types=["full_attention", "sliding_attention"],
        sliding_window=16,
        layer_rope_theta=bases,
    )
    with torch.device("meta" if meta else "cpu"):
        return AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("meta", [False, True])  # on the meta device (a config-only push), from the configs' bases
def test_per_layer_rope_bases_are_refused(meta):
    """GraniteSWA's ``layer_rope_theta``: one rotary module per base. One set of new frequencies written into every
    module would give the 5e5-base layers the 1e4 base's, reported as native."""
    model = granite_swa([1e4, 5e5], meta)
    for method in ("pi", "yarn"):
        if not meta:
            assert_refused(model, method, {"factor": 4}, ValueError, "rotary modules hold different frequencies")
            continue
        config = model.config.to_dict()  # meta tensors hold nothing to compare
        with pytest.raises(ValueError, match="rotary modules hold different frequencies"):
            hf_posenc.patch(model, method, factor=4)
        assert hf_posenc.get_patch(model) is None and model.config.to_dict() == config


@pytest.mark.parametrize("meta", [False, True])
def test_one_base_in_several_rotary_modules_is_patched_as_transformers_builds_it(meta):
    """GraniteSWA with one base: a module per layer and a shared one, all alike; patched as the native config."""
    model = granite_swa([1e4, 1e4], meta)
    hf_posenc.patch(model, "yarn", factor=4)
    assert hf_posenc.get_patch(model).native
    if not meta:
        native = AutoModelForCausalLM.from_config(model.config)
        expected = native.model.rotary_emb.inv_freq
        assert all(torch.equal(module.inv_freq, expected) for module in model.model.rotary_embs)


def test_nope_on_per_layer_rope_bases_removes_every_rotation(tmp_path):
    """NoPE writes no frequencies, so GraniteSWA's per-layer bases are moot: the patched model is the one whose
    every rotary module turns by zero; it saves, reloads through hf_posenc alone, and unpatches bit for bit."""
    model = granite_swa([1e4, 5e5]).eval()
    reference = copy.deepcopy(model)
    for _, module in rotary_modules(reference):
        module.inv_freq.zero_()
    with torch.no_grad():
        original, expected = model(ids()).logits, reference(ids()).logits
        hf_posenc.patch(model, "nope")
        assert torch.equal(model(ids()).logits, expected) and not torch.equal(expected, original)
        model.save_pretrained(tmp_path)
        assert torch.equal(hf_posenc.from_pretrained(tmp_path).eval()(ids()).logits, expected)
        with pytest.raises(KeyError):
            AutoModelForCausalLM.from_pretrained(tmp_path)
        hf_posenc.unpatch(model)
        assert torch.equal(model(ids()).logits, original)


def tiny_deepseek_v3() -> torch.nn.Module:
    return build(
        "deepseek_v3",
        intermediate_size=96,
        num_key_value_heads=4,
        kv_lora_rank=16,
        q_lora_rank=24,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        moe_intermediate_size=32,
    )


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("ntk-by-parts", {}),
        ("yarn", {"attention_factor": 1.3}),
        ("yarn", {"mscale": 1.0, "mscale_all_dim": 1.0}),
        ("yarn", {}),
    ],
)
def test_deepseek_loads_the_patched_model_without_hf_posenc(method, params, tmp_path):
    """DeepSeek-V3's attention multiplies its softmax scale by ``(0.1 mscale_all_dim ln s + 1)^2`` when the config
    has the pair: written for SGLang and TGI, it made plain transformers build another model (logits off by ~1e-3).
    On such a family the pair is left out; ``attention_factor`` says the factor to transformers. vLLM's and SGLang's
    DeepSeek code reads the pair only (defaults 1 and 0: YaRN's ``0.1 ln s + 1``): ``check`` says they differ
    where the factor is another."""
    model = tiny_deepseek_v3()
    hf_posenc.patch(model, method, factor=4, **params)
    assert hf_posenc.get_patch(model).native
    assert not {"mscale", "mscale_all_dim"} & set(model.config.rope_parameters)
    factor = model.config.rope_parameters["attention_factor"]
    verdicts = {finding.engine: finding for finding in engine_findings(model.config.to_dict())}
    default = math.isclose(factor, 0.1 * math.log(4) + 1, rel_tol=1e-12)
    for engine in ("vllm", "sglang"):
        assert verdicts[engine].severity == ("ok" if default else "differs")
        if not default:
            assert f"attention factor 1.1386 where transformers uses {factor:.4f}" in verdicts[engine].message
    model.save_pretrained(tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert plain.model.layers[0].self_attn.scaling == model.model.layers[0].self_attn.scaling
    with torch.no_grad():
        assert torch.equal(plain(ids()).logits, model(ids()).logits)


def test_families_whose_attention_ignores_the_pair_still_get_it():
    """The pair stays where the attention does not read it (Llama): SGLang and TGI take the factor from it."""
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **SMALL, intermediate_size=96))
    hf_posenc.patch(model, "ntk-by-parts", factor=4)
    assert {key: model.config.rope_parameters[key] for key in ("mscale", "mscale_all_dim")} == {
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    }


def test_nope_on_phi3_is_refused_at_patch_time():
    """Phi3Config accepts rope types default and longrope only: NoPE's marker would patch, then fail the save."""
    model = build(
        "phi3", intermediate_size=96, num_key_value_heads=2, original_max_position_embeddings=L, pad_token_id=0
    )
    assert_refused(model, "nope", {}, ValueError, r"Phi3Config refuses the config that method 'nope' writes")
