"""One typed method value end to end: ``patch`` takes a parsed :class:`MethodSpec`, and ``dry_run`` resolves a method
on a model as ``patch`` would, without changing it."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import make_tiny

import hf_posenc
from hf_posenc.patching import dry_run, learned_table_rows
from hf_posenc.spec import MethodSpec

IDS = torch.arange(1, 49).reshape(1, 48) % 97


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


@pytest.mark.parametrize("text", ["yarn:factor=4", "alibi", "self-extend:group_size=2,window=16", "ntk:factor=2"])
def test_a_parsed_spec_patches_as_its_name_and_parameters_do(text):
    spec = MethodSpec.parse(text)
    by_spec, by_name = make_tiny("llama"), make_tiny("llama")
    hf_posenc.patch(by_spec, spec)
    hf_posenc.patch(by_name, spec.method, **spec.params)
    assert hf_posenc.get_patch(by_spec) == hf_posenc.get_patch(by_name)
    assert torch.equal(_logits(by_spec), _logits(by_name))
    with hf_posenc.patched(make_tiny("llama"), spec) as model:
        assert torch.equal(_logits(model), _logits(by_name))


def test_a_spec_carries_its_parameters_and_none_patches_nothing():
    model = make_tiny("llama")
    with pytest.raises(TypeError, match=r"from the MethodSpec; got factor too"):
        hf_posenc.patch(model, MethodSpec.parse("yarn:factor=4"), factor=2)
    with pytest.raises(ValueError, match=r"'none' is the unpatched model"):
        hf_posenc.patch(model, MethodSpec.parse("none"))
    assert hf_posenc.get_patch(model) is None


@pytest.mark.parametrize("family,text", [("llama", "yarn:factor=4"), ("llama", "dca"), ("gpt2", "alibi")])
def test_a_dry_run_resolves_what_patch_resolves_and_changes_nothing(family, text):
    model = make_tiny(family)
    config, state, before = copy.deepcopy(model.config.to_dict()), model.state_dict(), _logits(model)
    planned = dry_run(model, MethodSpec.parse(text))
    assert model.config.to_dict() == config and hf_posenc.get_patch(model) is None
    assert all(torch.equal(tensor, model.state_dict()[name]) for name, tensor in state.items())
    assert torch.equal(_logits(model), before)
    hf_posenc.patch(model, MethodSpec.parse(text))
    assert planned.info == hf_posenc.get_patch(model)
    assert planned.table_rows == learned_table_rows(model)


def test_a_dry_run_gives_the_rows_gpt2s_table_will_have():
    """PI on GPT-2 resamples ``wpe`` to ``round(factor * n_positions)`` rows; ALiBi replaces it (any length)."""
    model = make_tiny("gpt2")  # n_positions 64
    assert dry_run(model, "pi", factor=2.5).table_rows == 160
    assert dry_run(model, "alibi").table_rows is None
    assert learned_table_rows(model) == 64


def test_a_dry_run_refuses_what_patch_refuses():
    model = make_tiny("llama")
    with pytest.raises(ValueError, match="factor"):
        dry_run(model, "yarn", factor=0.5)
    hf_posenc.patch(model, "yarn", factor=2)
    with pytest.raises(RuntimeError, match="already patched"):
        dry_run(model, "ntk", factor=2)
