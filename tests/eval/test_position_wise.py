"""The MLPs and norms over slices of the sequence: the same hidden states as one call, bitwise on CPU (float32 and
bfloat16, every family), from slices of equal size (at least 256 positions), each module restored after the block."""

from __future__ import annotations

import logging

import pytest
import torch
from accelerate.hooks import ModelHook, add_hook_to_module, remove_hook_from_module
from tiny_models import CONFIGS, make_tiny
from tiny_runs import eval_args, results_of
from torch import nn

from hf_posenc.cli import main
from hf_posenc.eval.perplexity import cumulative_nll
from hf_posenc.eval.position_wise import position_wise_modules, sequence_slices

FAMILIES = [*sorted(CONFIGS), "gpt2"]


def _hidden(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.get_decoder()(input_ids=ids, use_cache=False)[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", FAMILIES)
def test_sliced_hidden_states_equal_one_call_bitwise(family, dtype):
    model = make_tiny(family, attn_implementation="sdpa", **({"n_positions": 1024} if family == "gpt2" else {}))
    model = model.to(dtype)
    ids = torch.randint(0, 97, (2, 1001), generator=torch.Generator().manual_seed(3))
    whole = _hidden(model, ids)
    with sequence_slices(model, 300):  # 4 slices of 250 and 251 positions
        sliced = _hidden(model, ids)
    assert torch.equal(sliced, whole)


def test_the_modules_are_each_layers_mlp_and_norms_and_the_final_norm():
    model = make_tiny("llama")
    layers = model.model.layers
    expected = [model.model.norm]
    for layer in layers:
        expected += [layer.mlp, layer.input_layernorm, layer.post_attention_layernorm]
    assert sorted(map(id, position_wise_modules(model))) == sorted(map(id, expected))
    gpt2 = make_tiny("gpt2")
    blocks = gpt2.transformer.h
    expected = [gpt2.transformer.ln_f, *(m for b in blocks for m in (b.ln_1, b.ln_2, b.mlp))]
    assert sorted(map(id, position_wise_modules(gpt2))) == sorted(map(id, expected))


def test_slices_are_equal_and_at_most_the_size_and_the_block_restores_each_module():
    model = make_tiny("llama")
    rows: list[int] = []
    model.model.layers[0].mlp.down_proj.register_forward_pre_hook(lambda _, args: rows.append(args[0].shape[1]))
    ids = torch.randint(0, 97, (1, 600), generator=torch.Generator().manual_seed(5))
    with sequence_slices(model, 256):
        _hidden(model, ids)
        short = len(rows)
        _hidden(model, ids[:, :256])  # not longer than a slice: one call
    assert rows == [200, 200, 200, 256] and short == 3
    assert not any("forward" in module.__dict__ for module in position_wise_modules(model))
    rows.clear()
    _hidden(model, ids)
    assert rows == [600]


class PairMLP(nn.Module):
    """Named like an MLP, but returns a pair: not one tensor per position."""

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return hidden * 2, hidden.sum()


def _holding(module: nn.Module) -> nn.Module:
    """A model whose decoder holds ``module`` as a child."""
    model = nn.Module()
    model.get_decoder = lambda: model
    model._no_split_modules = []
    model.mlp = module
    return model


def test_a_module_whose_output_is_not_one_tensor_per_position_runs_whole_and_is_said_once(caplog):
    module, hidden = PairMLP(), torch.randn(1, 600, 3)
    with caplog.at_level(logging.INFO, logger="hf_posenc"), sequence_slices(_holding(module), 256):
        for _ in range(2):
            doubled, total = module(hidden)
            assert torch.equal(doubled, hidden * 2) and torch.equal(total, hidden.sum())
    assert caplog.text.count("PairMLP does not return one tensor per position") == 1


class KeywordMLP(nn.Module):
    """Position-wise, called with its input by keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[int] = []

    def forward(self, hidden_states: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        self.rows.append(hidden_states.shape[1])
        return hidden_states * scale


def test_an_input_given_by_keyword_is_sliced_with_the_other_tensors_of_its_shape():
    module, hidden = KeywordMLP(), torch.randn(2, 600, 3)
    scale = torch.randn(2, 600, 1)
    with sequence_slices(_holding(module), 256):
        out = module(hidden_states=hidden, scale=scale)
    assert torch.equal(out, hidden * scale) and module.rows == [200, 200, 200]


def test_a_module_listed_twice_is_sliced_once_and_one_with_an_offload_hook_below_is_left_whole():
    model = make_tiny("llama")
    model._no_split_modules = [*model._no_split_modules, type(model.model).__name__]  # the decoder as a layer too
    modules = position_wise_modules(model)
    assert len(modules) == len({id(m) for m in modules}) == 7
    add_hook_to_module(model.model.layers[0].mlp.down_proj, ModelHook())  # what an offload puts on the weights
    assert model.model.layers[0].mlp not in position_wise_modules(model)
    ids = torch.randint(0, 97, (1, 600), generator=torch.Generator().manual_seed(2))
    whole = _hidden(model, ids)
    with sequence_slices(model, 256):
        assert torch.equal(_hidden(model, ids), whole)
    assert not any("forward" in module.__dict__ for module in modules)


def test_under_an_accelerate_hook_the_inner_forward_is_sliced_and_the_hook_runs_once():
    model = make_tiny("llama")
    mlp = model.model.layers[1].mlp

    class Count(ModelHook):
        calls = 0

        def pre_forward(self, module, *args, **kwargs):
            Count.calls += 1
            return args, kwargs

    add_hook_to_module(mlp, Count())
    rows: list[int] = []
    mlp.down_proj.register_forward_pre_hook(lambda _, args: rows.append(args[0].shape[1]))
    ids = torch.randint(0, 97, (1, 700), generator=torch.Generator().manual_seed(7))
    whole = _hidden(model, ids)
    with sequence_slices(model, 256):
        sliced = _hidden(model, ids)
    assert torch.equal(sliced, whole) and rows == [700, 233, 233, 234] and Count.calls == 2
    assert mlp._old_forward.__func__ is type(mlp).forward  # the hook's inner forward, restored
    remove_hook_from_module(mlp)


@pytest.mark.parametrize("size", [-1, 1, 255, 256.0, True])
def test_a_size_that_is_not_a_whole_number_of_positions_is_refused(size):
    model = make_tiny("llama")
    with pytest.raises(ValueError, match="sequence slice"), sequence_slices(model, size):
        pass
    assert not any("forward" in module.__dict__ for module in position_wise_modules(model))


def test_an_eval_in_slices_writes_the_numbers_of_one_call(tiny_dir, tmp_path):
    """Every method's rows, 300-token windows in slices of 256 positions against one call: the same NLL, bitwise."""
    runs = {}
    for size in ("0", "256"):
        argv = [*eval_args(tiny_dir, tmp_path / size), "--lengths", "32,300", "--sequence-slice", size]
        assert main([*argv, "--method", "none", "--method", "yarn:factor=8", "--method", "self-extend"]) == 0
        runs[size] = [(row["method"], row["length"], row["nll"]) for row in results_of(tmp_path / size)["results"]]
    assert runs["256"] == runs["0"] and len(runs["0"]) == 6


@pytest.mark.slow
@pytest.mark.xdist_group("smollm2")
def test_real_model_nll_with_slices_equals_one_call_bitwise(smollm2, essay_ids):
    model, _ = smollm2
    ids = essay_ids[:, :300]
    whole = cumulative_nll(model, ids, 1)
    with sequence_slices(model, 256):  # two slices of 150
        sliced = cumulative_nll(model, ids, 1)
    assert torch.equal(sliced, whole)
