"""A model inside a wrapper (peft's ``PeftModel``, ``torch.compile``): the patch and its record go to the model it
wraps, so LoRA fine-tuning of a patched model merges into a model that still unpatches bit for bit."""

import pytest
import torch
from helpers import assert_same, snapshot
from hub_server import BASE_REPO, upload_base
from peft import LoraConfig, get_peft_model
from tiny_models import make_tiny
from transformers import AutoModelForCausalLM

import hf_posenc

METHODS = [("yarn", {"factor": 4}), ("dynamic-ntk", {"factor": 2}), ("alibi", {}), ("self-extend", {}), ("t5-bias", {})]


def _lora(model):
    return get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", lora_dropout=0.0))


@pytest.mark.parametrize("through", ["PeftModel", "LoraModel"])
@pytest.mark.parametrize(("method", "params"), METHODS)
def test_a_peft_model_is_patched_in_the_model_it_wraps_and_merges_patched(method, params, through, one_thread):
    """``patch(peft_model)`` (or of its tuner, ``peft_model.base_model``, a ``LoraModel``) patches the model it wraps,
    which holds the record: ``get_patch`` reads it through the wrapper, the LoRA model computes what the patched base
    does (adapters start at zero), and after ``merge_and_unload()`` the merged model is the patched one, which
    unpatches to the original bit for bit."""
    base = make_tiny("llama")
    original = snapshot(base)
    reference = hf_posenc.patch(make_tiny("llama"), method, **params)
    ids = torch.randint(0, base.config.vocab_size, (1, 150), generator=torch.Generator().manual_seed(0))
    lora = _lora(base)
    wrapper = lora if through == "PeftModel" else lora.base_model
    assert type(wrapper).__name__ == through
    assert hf_posenc.patch(wrapper, method, **params) is wrapper
    assert hf_posenc.get_patch(wrapper) == hf_posenc.get_patch(base) == hf_posenc.get_patch(reference)
    with torch.no_grad():
        torch.testing.assert_close(lora(input_ids=ids).logits, reference(ids).logits, rtol=0, atol=1e-6)
    merged = lora.merge_and_unload()
    assert merged is base and hf_posenc.get_patch(merged).method == method
    assert_same(original, snapshot(hf_posenc.unpatch(merged)))


def test_a_patched_model_wrapped_afterwards_reads_and_unpatches_through_the_wrapper(one_thread):
    """Patch, then wrap: the wrapper reports the patch, refuses a second one as already patched (not "not loaded
    through hf_posenc", a wrong diagnosis), and unpatches the model it wraps."""
    base = make_tiny("llama")
    original = snapshot(base)
    lora = _lora(hf_posenc.patch(base, "yarn", factor=4))
    assert hf_posenc.get_patch(lora).params["factor"] == 4.0
    with pytest.raises(RuntimeError, match="already patched with 'yarn'"):
        hf_posenc.patch(lora, "pi", factor=2)
    hf_posenc.unpatch(lora)
    assert hf_posenc.get_patch(base) is None
    assert_same(original, snapshot(lora.merge_and_unload()))


def test_a_compiled_model_is_patched_in_its_original(one_thread):
    """``torch.compile(model)`` wraps ``model`` (compiled at the first call, not here): the patch and its record go to
    ``model``, so it unpatches from either."""
    base = make_tiny("llama")
    compiled = torch.compile(base)
    original = snapshot(base)  # after the wrapping, which marks the model (_is_torch_compile)
    with hf_posenc.patched(compiled, "alibi") as same:
        assert same is compiled and hf_posenc.get_patch(base).method == "alibi"
    assert hf_posenc.get_patch(base) is None
    assert_same(original, snapshot(base))


@pytest.mark.parametrize("method", ["yarn", "t5-bias"])
def test_lora_trained_on_a_patched_model_merges_into_a_model_that_saves_and_loads_patched(method, tmp_path, one_thread):
    """The LoRA path from Python: patch, wrap, (train: here adapters set to random values), merge, save; the saved
    model loads through ``hf_posenc.from_pretrained`` patched as it was, with the merged weights."""
    lora = _lora(hf_posenc.patch(make_tiny("llama", attn_implementation="sdpa"), method, **dict(METHODS)[method]))
    with torch.no_grad():
        for name, parameter in lora.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.05, generator=torch.Generator().manual_seed(len(name)))
    ids = torch.randint(0, lora.config.vocab_size, (1, 150), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        trained = lora(input_ids=ids).logits
        merged = lora.merge_and_unload()
        torch.testing.assert_close(merged(ids).logits, trained, rtol=1e-5, atol=1e-5)
        merged.save_pretrained(tmp_path / "merged")
        loaded = hf_posenc.from_pretrained(tmp_path / "merged")  # sdpa, as the model saved
        assert hf_posenc.get_patch(loaded) == hf_posenc.get_patch(merged)
        torch.testing.assert_close(loaded(ids).logits, merged(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("with_weights", [False, True])
def test_a_peft_model_is_refused_by_push_before_anything_is_pushed(fake_hub, with_weights):
    """A ``PeftModel``'s ``save_pretrained`` writes its adapters alone: pushed, the repo would hold the base model
    without them (or no model). Refused, naming ``merge_and_unload()``; no repo made."""
    upload_base()
    lora = _lora(hf_posenc.patch(AutoModelForCausalLM.from_pretrained(BASE_REPO), "yarn", factor=4))
    with pytest.raises(ValueError, match=r"PeftModel wraps the model to push; .*`merge_and_unload\(\)` first"):
        hf_posenc.push_to_hub(lora, "me/lora", with_weights=with_weights)
    assert "me/lora" not in fake_hub.repos


def test_a_model_holding_adapter_layers_is_refused_by_push_before_anything_is_pushed(fake_hub):
    """Adapters put into the model itself (peft's ``inject_adapter_in_model``, not merged): saved, its layers' weights
    are named ``base_layer`` and ``lora_A`` / ``lora_B``, and the pushed repo would load with those layers new.
    Refused, naming the first layer; no repo made."""
    from peft import inject_adapter_in_model

    upload_base()
    model = hf_posenc.patch(AutoModelForCausalLM.from_pretrained(BASE_REPO), "yarn", factor=4)
    inject_adapter_in_model(LoraConfig(r=4, target_modules="all-linear", lora_dropout=0.0), model)
    with pytest.raises(ValueError, match=r"`model` holds peft adapter layers \(model.layers.0.self_attn.q_proj, "):
        hf_posenc.push_to_hub(model, "me/lora", with_weights=True)
    assert "me/lora" not in fake_hub.repos
