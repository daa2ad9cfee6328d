"""Continued pretraining (``hf_posenc.training``, ``hf-posenc train``) on tiny random models: packing, what
trains, saving and reloading, resuming a killed run, GGUF-loaded models, and the command end to end."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers
from helpers import assert_same, snapshot
from tiny_models import make_tiny
from torch import nn
from transformers import AutoModelForCausalLM, GgufConfig, TrainerCallback
from transformers.quantizers.quantizer_gguf import GgufHfQuantizer

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.training import TrainSettings, TrainSummary, pack_windows, release_gguf, select_trainable, train
from hf_posenc.training import run as run_module
from hf_posenc.training.checkpoints import readable_by_the_trainer

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[2]

LENGTH = 32
# A short cycle repeated: a tiny model learns it within a few dozen steps.
DATA = pack_windows([[3 + (i * i) % 11 for i in range(700)]], LENGTH, eos_id=2, bos_id=1)


def _settings(**changes) -> TrainSettings:
    return TrainSettings(**{"length": LENGTH, "steps": 12, "learning_rate": 1e-3, "save_steps": 5, **changes})


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"steps": 3.5}, "`steps` must be a positive integer, not 3.5."),
        ({"steps": True}, "`steps` must be a positive integer, not True."),  # not one step
        ({"batch_size": 1.5}, "`batch_size` must be a positive integer, not 1.5."),
        ({"gradient_accumulation_steps": 2.0}, "`gradient_accumulation_steps` must be a positive integer, not 2.0."),
        ({"warmup_steps": 0.5}, "`warmup_steps` must be a whole number, 0 or more, not 0.5."),
        ({"bf16": "no"}, "`bf16` must be True or False, not 'no'."),  # a truthy string would turn autocast on
        ({"resume": 1}, "`resume` must be True or False, not 1."),
        ({"gradient_checkpointing": "yes"}, "`gradient_checkpointing` must be True or False, not 'yes'."),
        ({"seed": True}, "`seed` must be a whole number from 0 to 2**32 - 1"),
        ({"trainable": "lora", "lora_rank": 0}, "`lora_rank` must be a positive integer, not 0."),
        ({"trainable": "lora", "lora_alpha": -1.0}, "`lora_alpha` must be a positive number, not -1.0."),
        (
            {"lora_rank": 8},
            "`lora_rank` sets the LoRA adapters of `trainable` 'lora'; leave it out with `trainable` 'all'.",
        ),
        (
            {"trainable": "position", "lora_rank": 8, "lora_alpha": 3.0},
            "`lora_rank` and `lora_alpha` set the LoRA adapters of `trainable` 'lora'; leave them out",
        ),
    ],
)
def test_settings_of_the_wrong_type_are_refused_before_a_run_starts(change, said):
    """The API's TrainSettings, as the CLI's parser: a float or a bool where a count goes, or a string where a switch
    goes, is refused when the settings are made: before train_run.json is written (a failure in the Trainer would
    leave a folder that refuses both a retry and a resume), and never run with the value read otherwise."""
    with pytest.raises(ValueError, match=re.escape(said)):
        _settings(**change)


def _snapshot(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("hf-posenc train:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_windows_are_bos_then_the_stream_cut_in_spans():
    docs = [[10, 11, 12], [], [20, 21], [30, 31, 32, 33]]
    packed = pack_windows(docs, 4, eos_id=2, bos_id=1)
    # stream: 10 11 12 EOS 20 21 EOS 30 31 32 33 (the empty document adds nothing); spans of 3 after the BOS
    assert packed.windows.tolist() == [[1, 10, 11, 12], [1, 2, 20, 21], [1, 2, 30, 31]]
    assert (packed.stream_tokens, packed.dropped_tokens, len(packed), packed.length) == (11, 2, 3, 4)
    item = packed[1]
    assert item["input_ids"].tolist() == [1, 2, 20, 21] and item["labels"].tolist() == [-100, 2, 20, 21]


def test_without_bos_and_eos_windows_are_the_plain_concatenation():
    packed = pack_windows([[10, 11, 12], [20, 21], [30, 31, 32, 33]], 4, eos_id=None, bos_id=None)
    assert packed.windows.tolist() == [[10, 11, 12, 20], [21, 30, 31, 32]]
    assert (packed.stream_tokens, packed.dropped_tokens) == (9, 1)


def test_too_little_text_for_one_window_is_refused():
    with pytest.raises(
        ValueError, match=r"The documents of `texts` make 6 tokens, fewer than one window of `length` 8 takes \(7 text"
    ):
        pack_windows([[5, 6, 7], [8, 9]], 8, eos_id=2, bos_id=1)


def test_the_loss_falls_on_repetitive_text(tmp_path):
    result = train(make_tiny("llama"), None, DATA, tmp_path / "out", _settings(steps=30, save_steps=100), "alibi")
    assert [step for step, _ in result.losses] == list(range(1, 31)) and result.steps == 30
    assert result.losses[-1][1] < 0.7 * result.losses[0][1], result.losses
    assert result.final_loss == result.losses[-1][1]


@pytest.mark.parametrize(("family", "method"), [("llama", "nope"), ("gpt2", "nope"), ("gpt2", "t5-bias")])
def test_the_logged_loss_is_the_mean_nll_of_the_predicted_tokens(tmp_path, family, method):
    """One step on a batch of every window: its loss is the patched model's mean NLL at the start, computed here
    (GPT-2, whose loss_type is None, logged it times (length - 1) / length: the Trainer counted the first tokens)."""
    import torch.nn.functional as F

    data = pack_windows([torch.randint(3, 97, (4 * (LENGTH - 1),)).tolist()], LENGTH, eos_id=None, bos_id=1)
    deterministic = {"attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0} if family == "gpt2" else {}
    reference = hf_posenc.patch(make_tiny(family, **deterministic), method)
    with torch.no_grad():
        logits = reference(data.windows).logits
    expected = F.cross_entropy(logits[:, :-1].flatten(0, 1), data.windows[:, 1:].flatten()).item()
    settings = _settings(steps=1, batch_size=len(data), save_steps=100)
    result = train(make_tiny(family, **deterministic), None, data, tmp_path / "out", settings, method)
    assert result.losses[0][1] == pytest.approx(expected, rel=1e-5)


_POSITION_CASES = [("llama", "alibi"), ("gpt2", "alibi"), ("llama", "t5-bias"), ("gpt2", "t5-bias")]


@pytest.mark.parametrize(("family", "method"), _POSITION_CASES)
def test_position_trains_only_the_added_parameters_and_the_norms(tmp_path, family, method):
    model = make_tiny(family)
    before = {name: value.clone() for name, value in model.named_parameters()}
    norms = {name for name in before if "norm" in name or ".ln_" in name}
    assert norms and len(norms) < len(before)
    result = train(model, None, DATA, tmp_path / "out", _settings(steps=5, trainable="position"), method)
    after = dict(model.named_parameters())
    added = set(after) - set(before)
    assert added == ({f"{model.base_model_prefix}.position_bias.weight"} if method == "t5-bias" else set())
    assert result.trainable_parameters == sum(after[name].numel() for name in norms | added)
    for name, value in before.items():
        assert torch.equal(after[name], value) == (name not in norms), name  # bit-identical, or trained
    initial = hf_posenc.patch(make_tiny(family), method)
    for name in added:
        assert not torch.equal(after[name], initial.get_parameter(name)), name


@pytest.mark.parametrize(("family", "method"), [("llama", "t5-bias"), ("gpt2", "alibi")])
def test_lora_trains_low_rank_updates_of_the_linear_layers_the_norms_and_the_position_parameters(
    tmp_path, recwarn, family, method
):
    """``trainable="lora"``: each linear layer but the output moves by a matrix of rank at most ``r`` (``(α/r)·B·A``,
    merged at the end), the norms and the added position parameters train, every other weight stays bit for bit;
    the model handed back and the one saved hold no adapter, and the saved one reloads patched with its logits."""
    model, out = make_tiny(family), tmp_path / "out"
    before = {name: value.clone() for name, value in model.state_dict().items()}
    linear = {f"{name}.weight" for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    linear |= {f"{name}.weight" for name, module in model.named_modules() if type(module).__name__ == "Conv1D"}
    linear -= {"lm_head.weight"}  # the output layer: not adapted
    norms = {name for name in before if "norm" in name or ".ln_" in name}
    result = train(model, None, DATA, out, _settings(steps=6, trainable="lora", lora_rank=2), method)
    after = model.state_dict()
    added = set(after) - set(before)
    assert not any("lora" in name for name in after) and linear and norms
    assert not hasattr(model, "peft_config")  # peft's description of the adapters the model no longer has
    assert not [w for w in recwarn if "fan_in_fan_out" in str(w.message)]  # GPT-2's Conv1D weights are (in, out)
    for name, value in before.items():
        if name in linear:
            assert torch.linalg.matrix_rank(after[name] - value).item() == 2, name  # r = 2, B no longer zero
        else:
            assert torch.equal(after[name], value) == (name not in norms), name
    assert added == ({f"{model.base_model_prefix}.position_bias.weight"} if method == "t5-bias" else set())
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["trainable_parameters"] == result.trainable_parameters > sum(after[n].numel() for n in norms | added)
    assert summary["settings"] | {"trainable": "lora", "lora_rank": 2, "lora_alpha": 4.0} == summary["settings"]
    reloaded = hf_posenc.from_pretrained(out).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(DATA.windows[:2]).logits, model(DATA.windows[:2]).logits)


def test_lora_without_peft_is_refused_when_the_settings_are_made(monkeypatch):
    from hf_posenc.training import settings

    monkeypatch.setattr(settings.importlib.util, "find_spec", lambda name: None if name == "peft" else object())
    with pytest.raises(ValueError, match=re.escape("`trainable` 'lora' needs peft: pip install 'hf-posenc[lora]'")):
        _settings(trainable="lora")


def test_position_trains_gpt2s_table_as_pi_interpolated_it(tmp_path):
    """pi on GPT-2 adds no parameter: its position encoding is the learned table, resampled. ``trainable`` position
    trains that table (from the interpolated values) and the norms, every other weight bit for bit, and the
    position learning rate applies to it."""
    model = make_tiny("gpt2")
    before = {name: value.clone() for name, value in model.named_parameters()}
    trained = {name for name in before if "norm" in name or ".ln_" in name} | {"transformer.wpe.weight"}
    settings = _settings(steps=3, trainable="position", position_learning_rate=1e-2, save_steps=100)
    result = train(model, None, DATA, tmp_path / "out", settings, "pi:factor=2")
    after = dict(model.named_parameters())
    assert set(after) == set(before)
    assert result.trainable_parameters == sum(after[name].numel() for name in trained)
    for name, value in before.items():
        if name != "transformer.wpe.weight":
            assert torch.equal(after[name], value) == (name not in trained), name
    interpolated = hf_posenc.patch(make_tiny("gpt2"), "pi", factor=2).transformer.wpe.weight
    moved = (after["transformer.wpe.weight"] - interpolated).abs().max().item()
    assert 5e-3 < moved <= 3.1e-2  # three steps of about the position learning rate


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_t5_table_in_half_precision_is_warned_of(tmp_path, caplog, dtype):
    """A bfloat16 model makes a bfloat16 T5 table, whose entries of 4 and more a step of 1e-2 leaves unchanged: the
    run says so (a float32 one says nothing)."""
    settings = _settings(steps=1, trainable="position", position_learning_rate=1e-2, save_steps=100)
    with caplog.at_level("WARNING", logger="hf_posenc.training.run"):
        train(make_tiny("llama").to(dtype), None, DATA, tmp_path / "out", settings, "t5-bias")
    warned = [
        r.getMessage() for r in caplog.records if "position parameters (model.position_bias.weight)" in r.getMessage()
    ]
    assert len(warned) == (dtype == torch.bfloat16)
    if warned:
        assert "train in torch.bfloat16" in warned[0] and "Load the model in float32" in warned[0]


def test_the_position_learning_rate_moves_the_t5_table_and_nothing_else(tmp_path):
    """Adam moves each value by about the learning rate a step: the table by position_learning_rate, the rest by
    learning_rate; the same run without it moves the table as little as the rest."""
    moved = {}
    for name, rate in {"own": 1e-1, "shared": None}.items():
        model = make_tiny("llama")
        before = {key: value.clone() for key, value in model.named_parameters()}
        settings = _settings(steps=3, learning_rate=1e-4, position_learning_rate=rate, save_steps=100)
        train(model, None, DATA, tmp_path / name, settings, "t5-bias:num_buckets=8,max_distance=16")
        initial = hf_posenc.patch(make_tiny("llama"), "t5-bias", num_buckets=8, max_distance=16)
        table = (model.model.position_bias.weight - initial.model.position_bias.weight).abs().max().item()
        rest = max((value - before[key]).abs().max().item() for key, value in model.named_parameters() if key in before)
        moved[name] = (table, rest)
    assert 0.05 < moved["own"][0] <= 0.31 and moved["own"][1] <= 3.1e-4  # three steps of about the rate each
    assert moved["shared"][0] <= 3.1e-4 and moved["shared"][1] == pytest.approx(moved["own"][1], rel=0.1)


class _Groups(TrainerCallback):
    """Each run's optimizer at its start: its type, options, and per group (lr, weight decay, parameter names)."""

    def __init__(self):
        self.seen = []

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        names = {id(p): name for name, p in model.named_parameters()}
        groups = [
            (g["initial_lr"], g["weight_decay"], {names[id(p)] for p in g["params"]}) for g in optimizer.param_groups
        ]
        self.seen.append((type(optimizer), optimizer.defaults, groups))


def test_the_position_learning_rate_is_set_in_the_trainers_own_optimizer(tmp_path, monkeypatch):
    """The position rate splits the Trainer's own optimizer (its class, options and weight-decay groups) where the
    Trainer builds it: under FSDP, after wrapping, since Trainer refuses `optimizers` there (as this test's Trainer
    does): train passes no optimizer of its own."""
    refuse = transformers.Trainer.__init__

    def fsdp_like(self, *args, **kwargs):  # transformers' rule under FSDP
        if any(item is not None for item in kwargs.get("optimizers", (None, None))):
            raise RuntimeError("Passing `optimizers` is not allowed if PyTorch FSDP is enabled.")
        refuse(self, *args, **kwargs)

    monkeypatch.setattr(transformers.Trainer, "__init__", fsdp_like)
    groups = _Groups()
    for name, rate in {"shared": None, "own": 0.5}.items():
        settings = _settings(steps=1, learning_rate=1e-3, position_learning_rate=rate, save_steps=100)
        train(make_tiny("llama"), None, DATA, tmp_path / name, settings, "t5-bias", callbacks=[groups])
    (shared_type, shared_options, shared), (own_type, own_options, own) = groups.seen
    assert own_type is shared_type and own_options == shared_options
    table = {"model.position_bias.weight"}
    assert [decay for _, decay, names in shared if table & names] == [0.0]
    assert own == [(1e-3, decay, names - table) for _, decay, names in shared] + [(0.5, 0.0, table)]


@pytest.mark.parametrize("method", ["alibi", "nope", "sinusoidal", "t5-bias"])
def test_gpt2s_replaced_table_does_not_train(tmp_path, method):
    """The learned table a method replaced stays in the model unused: it must not count, nor wait for a gradient."""
    model = make_tiny("gpt2")
    wpe = model.transformer.wpe.weight.detach().clone()
    result = train(model, None, DATA, tmp_path / "out", _settings(steps=2), method)
    trained = dict(model.named_parameters())
    assert torch.equal(trained["transformer.wpe.weight"], wpe) and not trained["transformer.wpe.weight"].requires_grad
    assert result.trainable_parameters == sum(p.numel() for n, p in trained.items() if n != "transformer.wpe.weight")


def test_an_already_patched_model_is_refused_before_anything_is_written(tmp_path):
    model = hf_posenc.patch(make_tiny("llama"), "alibi")
    with pytest.raises(ValueError, match="`model` is already patched with 'alibi'; pass the unpatched model"):
        train(model, None, DATA, tmp_path / "out", _settings(), "nope")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("method", ["none", "pi:factor=1.5"])
def test_windows_longer_than_gpt2s_table_are_refused_before_anything_is_written(tmp_path, method):
    """GPT-2's 64 rows (96 with pi x1.5) cannot take windows of 128 tokens: a clear error, no files (a rerun with
    another length is not blocked by a half-started run), the model as it was."""
    model = make_tiny("gpt2")
    before = snapshot(model)
    long = pack_windows([[3 + (i * i) % 11 for i in range(700)]], 128, eos_id=2, bos_id=1)
    with pytest.raises(ValueError, match=r"learned table of (64|96) rows, shorter than `length` 128"):
        train(model, None, long, tmp_path / "out", _settings(length=128), method)
    assert not (tmp_path / "out").exists() and hf_posenc.get_patch(model) is None
    assert_same(before, snapshot(model.eval()))


def test_a_refused_run_leaves_the_model_in_its_mode_and_with_its_frozen_parameters(tmp_path):
    """A check after the model was put in training mode refuses the run (alibi adds no position parameter for
    `position_learning_rate`): the model is handed back in eval mode, with the parameter the caller froze still
    frozen."""
    model = make_tiny("llama").eval()
    frozen = model.model.layers[0].self_attn.q_proj.weight.requires_grad_(False)
    flags = {name: parameter.requires_grad for name, parameter in model.named_parameters()}
    with pytest.raises(ValueError, match="has none"):
        train(model, None, DATA, tmp_path / "out", _settings(position_learning_rate=1e-2), "alibi")
    assert not model.training and not frozen.requires_grad and hf_posenc.get_patch(model) is None
    assert {name: parameter.requires_grad for name, parameter in model.named_parameters()} == flags
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("trainable", ["all", "lora"])
@pytest.mark.parametrize("fails", ["_write_json", "PositionRateTrainer"])
def test_a_run_that_fails_before_its_first_step_hands_the_model_back_as_it_was(tmp_path, monkeypatch, fails, trainable):
    """Writing the run's record fails (a full disk), or the Trainer fails to start after setting ``use_cache`` off:
    the model is handed back as it came, unpatched, without LoRA adapters, in its mode, with its frozen parameters
    and its cache setting."""
    model = make_tiny("llama").eval()
    model.model.layers[0].mlp.up_proj.weight.requires_grad_(False)
    before, flags = snapshot(model), {name: p.requires_grad for name, p in model.named_parameters()}

    def fail(*args, **kwargs):
        if "model" in kwargs:
            kwargs["model"].config.use_cache = False
        raise OSError("No space left on device")

    monkeypatch.setattr(run_module, fails, fail)
    with pytest.raises(OSError, match="No space left on device"):
        train(model, None, DATA, tmp_path / "out", _settings(trainable=trainable), "yarn:factor=2")
    assert hf_posenc.get_patch(model) is None and not model.training
    assert {name: p.requires_grad for name, p in model.named_parameters()} == flags
    assert_same(before, snapshot(model))


def test_checkpointing_and_accumulation_change_only_float_rounding(tmp_path):
    """Two windows a step as one batch, or as two accumulated forwards with activation checkpointing (the
    embeddings frozen: the recomputed forward must still reach the trained norms)."""
    runs = []
    for name, changes in {"batch": {"batch_size": 2}, "accumulated": {"gradient_accumulation_steps": 2}}.items():
        model = make_tiny("llama")
        settings = _settings(steps=4, trainable="position", gradient_checkpointing=name == "accumulated", **changes)
        runs.append((train(model, None, DATA, tmp_path / name, settings, "alibi"), list(model.parameters())))
    (batch, batch_weights), (accumulated, accumulated_weights) = runs
    assert [step for step, _ in accumulated.losses] == [1, 2, 3, 4]
    assert [loss for _, loss in accumulated.losses] == pytest.approx([loss for _, loss in batch.losses], abs=1e-5)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(batch_weights, accumulated_weights, strict=True))


def test_bf16_autocasts_on_a_cpu_and_keeps_float32_weights(tmp_path):
    """Asked on a CPU, the steps run in bfloat16 autocast: the losses move off the float32 run's by bfloat16's
    rounding (an autocast that did not engage would repeat them exactly); the weights stay float32."""
    runs = {}
    for bf16 in (False, True):
        model = make_tiny("llama")
        runs[bf16] = train(model, None, DATA, tmp_path / str(bf16), _settings(steps=4, bf16=bf16), "alibi").losses
        assert {p.dtype for p in model.parameters()} == {torch.float32}
        assert json.loads((tmp_path / str(bf16) / "train_summary.json").read_text())["bf16"] is bf16
    assert runs[True] != runs[False]
    assert [loss for _, loss in runs[True]] == pytest.approx([loss for _, loss in runs[False]], rel=2e-2)


def test_bf16_on_a_model_not_in_float32_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match=r"`bf16` autocast trains float32 weights; the model is in torch.bfloat16"):
        train(make_tiny("llama").to(torch.bfloat16), None, DATA, tmp_path / "out", _settings(bf16=True), "alibi")
    assert not (tmp_path / "out").exists()


def test_selecting_nothing_is_an_error():
    with pytest.raises(ValueError, match="`trainable` 'position' selects no parameter of Sequential"):
        select_trainable(nn.Sequential(nn.Linear(2, 2)), "position")


@pytest.mark.parametrize("method", ["alibi", "t5-bias"])
def test_the_saved_model_reloads_patched_with_the_same_logits(tmp_path, method):
    model, out = make_tiny("llama"), tmp_path / "out"
    train(model, None, DATA, out, _settings(steps=6), method)
    reloaded = hf_posenc.from_pretrained(out).eval()
    assert hf_posenc.get_patch(reloaded).method == method
    with torch.no_grad():
        assert torch.equal(reloaded(DATA.windows[:2]).logits, model(DATA.windows[:2]).logits)
    summary = json.loads((out / "train_summary.json").read_text())
    assert TrainSummary.read(out).to_json() == summary
    assert summary["method"] == method and summary["params"] == hf_posenc.get_patch(model).params
    assert summary["settings"]["steps"] == summary["steps"] == len(summary["losses"]) == 6
    assert summary["data"] == {**summary["data"], "windows": len(DATA), "dropped_tokens": DATA.dropped_tokens}
    assert "transformers" in summary["versions"] and summary["trainable_parameters"] > 0


class _Kill(TrainerCallback):
    """Raise at the start of step ``at + 1``: a run killed after its checkpoint at step ``at``."""

    def __init__(self, at: int):
        self.at = at

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            raise KeyboardInterrupt


# GPT-2 has dropout: its RNG state must come back too; LoRA's adapters and norms are in the checkpoints as well
# yarn: its config's rope_scaling (written for transformers 4) made transformers 5's resume raise (AttributeError)
@pytest.mark.parametrize(
    ("family", "trainable", "method"),
    [
        ("llama", "all", "alibi"),
        ("gpt2", "all", "alibi"),
        ("llama", "lora", "alibi"),
        ("llama", "all", "yarn:factor=2"),
    ],
)
def test_a_killed_run_resumes_where_it_stopped(tmp_path, monkeypatch, family, trainable, method):
    """On a CPU the resumed run is bit-identical to the uninterrupted one: the checkpoint holds the weights,
    the optimizer, the scheduler and the RNG states, and the Trainer skips the batches already seen (the
    shuffled order of the whole run is fixed by the seed). Its time counts every session (a clock that takes
    10 s a step here)."""
    tick = _Tick()
    monkeypatch.setattr(run_module, "time", SimpleNamespace(perf_counter=lambda: tick.now))
    settings = _settings(
        batch_size=2, trainable=trainable
    )  # 12 steps over 11 batches: the resumed part crosses an epoch
    whole = make_tiny(family)
    expected = train(whole, None, DATA, tmp_path / "whole", settings, method)
    killed = tmp_path / "killed"
    with pytest.raises(KeyboardInterrupt):
        train(make_tiny(family), None, DATA, killed, settings, method, callbacks=[_Kill(6), tick])
    assert sorted(p.name for p in killed.iterdir()) == [".hf-posenc-train.lock", "checkpoint-5", "train_run.json"]
    assert _recorded_seconds(killed / "checkpoint-5") == 50  # the killed session's time up to its checkpoint
    resumed = make_tiny(family)
    resume = _settings(batch_size=2, trainable=trainable, resume=True)
    result = train(resumed, None, DATA, killed, resume, method, callbacks=[tick])
    assert result.losses == expected.losses and result.steps == 12
    saved_config = (killed / "checkpoint-12" / "config.json").read_text()
    for (name, value), other in zip(whole.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(value, other), name
    # a finished run resumed: its last checkpoint loaded, no step more (the Trainer alone would take one), and no
    # time added, though loading it takes some (a clock that moves 3 s at each reading)
    readings = itertools.count(start=1000, step=3)
    monkeypatch.setattr(run_module, "time", SimpleNamespace(perf_counter=lambda: next(readings)))
    again = make_tiny(family)
    finished = train(again, None, DATA, killed, resume, method, callbacks=[tick])
    assert finished.losses == expected.losses
    assert all(torch.equal(a, b) for a, b in zip(whole.parameters(), again.parameters(), strict=True))
    assert (killed / "checkpoint-12" / "config.json").read_text() == saved_config  # yarn's rope_scaling put back
    # the time counts every session: the killed one's 5 steps, then the resumed one's 7; the finished run adds 0
    assert _recorded_seconds(killed / "checkpoint-12") == result.seconds == finished.seconds == 120
    assert json.loads((killed / "train_summary.json").read_text())["seconds"] == 120


def _killed_yarn_run(tmp_path: Path) -> tuple[TrainSettings, Path, Path, str]:
    """A yarn run killed after its checkpoint at step 5: its settings, folder, that checkpoint's config.json and the
    file's text (with the ``rope_scaling`` written for transformers 4's readers)."""
    settings = _settings(batch_size=2)
    killed = tmp_path / "killed"
    with pytest.raises(KeyboardInterrupt):
        train(make_tiny("llama"), None, DATA, killed, settings, "yarn:factor=2", callbacks=[_Kill(6)])
    config = killed / "checkpoint-5" / "config.json"
    saved = config.read_text()
    assert json.loads(saved)["rope_scaling"]["rope_type"] == "yarn"
    return settings, killed, config, saved


def test_a_resume_failing_in_the_trainer_leaves_the_checkpoints_config_as_it_was(tmp_path):
    """yarn's ``rope_scaling`` (for transformers 4's readers) is taken out of the checkpoint's config.json only while
    the Trainer resumes: a resume that fails there (a damaged optimizer state) puts it back."""
    settings, killed, config, saved = _killed_yarn_run(tmp_path)
    (killed / "checkpoint-5" / "optimizer.pt").write_bytes(b"damaged")
    with pytest.raises(Exception, match="optimizer|pickle|zip|load"):
        train(make_tiny("llama"), None, DATA, killed, dataclasses.replace(settings, resume=True), "yarn:factor=2")
    assert config.read_text() == saved


class _ReadConfig(TrainerCallback):
    """Read ``path`` as the first step begins (what a run killed then by SIGTERM, which runs no ``finally``, would
    leave), then stop the run."""

    def __init__(self, path: Path):
        self.path, self.text = path, None

    def on_step_begin(self, args, state, control, **kwargs):
        self.text = self.path.read_text()
        raise KeyboardInterrupt


def test_a_resumed_checkpoints_config_is_whole_once_training_begins(tmp_path):
    """The checkpoint's config.json is trimmed only until the Trainer has read it: a resume killed by SIGTERM while
    it trains (which runs no ``finally``: torchrun's to the other processes, a scheduler's pre-emption) leaves it
    whole: it is not left to ``train`` returning or raising to put it back."""
    settings, killed, config, saved = _killed_yarn_run(tmp_path)
    reader = _ReadConfig(config)
    resume = dataclasses.replace(settings, resume=True)
    with pytest.raises(KeyboardInterrupt):
        train(make_tiny("llama"), None, DATA, killed, resume, "yarn:factor=2", callbacks=[reader])
    assert reader.text == saved


def test_a_resume_killed_before_training_begins_leaves_the_config_for_the_next_resume(tmp_path):
    """Killed between the trim and the first step (SIGTERM: no ``finally``), the checkpoint's config.json as it was
    waits beside it, and the next resume puts it back before it reads it."""
    folder = tmp_path / "checkpoint-5"
    hf_posenc.patch(make_tiny("llama"), "yarn", factor=2).save_pretrained(folder)
    config = folder / "config.json"
    saved = config.read_text()
    assert json.loads(saved)["rope_scaling"]["rope_type"] == "yarn"
    killed = readable_by_the_trainer(str(folder), trim=True)  # held: a generator collected runs its finally
    killed.__enter__()  # the process killed inside the block
    assert "rope_scaling" not in json.loads(config.read_text())
    with readable_by_the_trainer(str(folder), trim=True):
        assert "rope_scaling" not in json.loads(config.read_text())
    assert config.read_text() == saved
    assert sorted(path.name for path in folder.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]


class _Tick(TrainerCallback):
    """A clock that advances 10 s at the end of each training step, and only then."""

    def __init__(self):
        self.now = 0.0

    def on_step_end(self, args, state, control, **kwargs):
        self.now += 10.0


def _recorded_seconds(checkpoint: Path) -> float:
    return json.loads((checkpoint / "hf_posenc_seconds.json").read_text())["seconds"]


def test_a_checkpoint_without_its_time_counts_none_with_a_warning(tmp_path, caplog):
    """A run killed between writing a checkpoint and its record of the training time: the resumed session counts
    from 0, and a warning says the summary counts its own time alone."""
    with caplog.at_level(logging.WARNING, logger="hf_posenc.training.run"):
        assert run_module._seconds_at(str(tmp_path)) == 0.0
    assert f"{tmp_path} records no training time; the summary counts this session's alone" in caplog.text


def _mark_as_gguf_loaded(model) -> None:
    """What transformers 5 leaves on a model loaded with ``gguf_file=`` whose weights it unpacked."""
    quantizer = GgufHfQuantizer(GgufConfig())
    model.hf_quantizer, model.is_quantized = quantizer, True
    model.quantization_method = quantizer.quantization_config.quant_method
    model.config.quantization_config, model.config._is_quantized = quantizer.quantization_config, True


def test_a_gguf_loaded_model_trains_and_saves(tmp_path):
    model = make_tiny("llama")
    _mark_as_gguf_loaded(model)
    with pytest.raises(ValueError, match=r"quantized with (QuantizationMethod\.GGUF|gguf) and is not serializable"):
        model.save_pretrained(tmp_path / "refused")
    train(model, None, DATA, tmp_path / "out", _settings(steps=2), "alibi")
    assert "quantization_config" not in json.loads((tmp_path / "out" / "config.json").read_text())
    reloaded = hf_posenc.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        assert torch.equal(reloaded(DATA.windows[:1]).logits, model(DATA.windows[:1]).logits)


def test_packed_gguf_weights_are_refused(tmp_path):
    model = make_tiny("llama")
    _mark_as_gguf_loaded(model)
    model.lm_head.weight = nn.Parameter(torch.zeros(97, 8, dtype=torch.uint8), requires_grad=False)
    with pytest.raises(ValueError, match=r"keeps 1 weights as packed GGUF blocks \(lm_head.weight"):
        release_gguf(model)


@pytest.mark.slow
@pytest.mark.xdist_group("smollm2")  # a copy of the real model the other tests of the group loaded
def test_the_real_gguf_model_saves_after_release(smollm2, tmp_path):
    import copy

    model = copy.deepcopy(smollm2[0])  # loaded from the GGUF file, float32
    assert model.is_quantized  # what transformers leaves, though every weight is float32
    release_gguf(model)
    model.save_pretrained(tmp_path / "saved")
    ids = torch.arange(100, 132)[None]
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved", dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, model(ids).logits)
    assert smollm2[0].is_quantized  # the fixture's own model untouched


def _train_args(tiny_dir, out, *extra: str) -> list[str]:
    model, texts = str(tiny_dir / "model"), str(tiny_dir / "texts")
    common = ["--length", str(LENGTH), "--steps", "4", "--save-steps", "2", "--learning-rate", "1e-3"]
    return ["train", "--model", model, "--dataset", texts, "--method", "alibi", *common, "--output", str(out), *extra]


def test_the_command_trains_saves_and_eval_scores_the_result(tiny_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(_train_args(tiny_dir, out)) == 0
    printed = capsys.readouterr().out
    assert f"Evaluate: hf-posenc eval --model {out}" in printed and "Trained " in printed
    names = {p.name for p in out.iterdir()}
    assert {"checkpoint-2", "checkpoint-4", "config.json", "model.safetensors", "tokenizer.json"} <= names
    summary = json.loads((out / "train_summary.json").read_text())
    # the tiny tokenizer has no EOS and adds no BOS: 581 characters in windows of 32, 5 dropped
    assert (summary["data"]["windows"], summary["data"]["dropped_tokens"], summary["data"]["bos"]) == (18, 5, False)
    assert summary["spec"] == "alibi" and summary["sources"]["dataset"]["name"] == str(tiny_dir / "texts")
    assert hf_posenc.get_patch(hf_posenc.from_pretrained(out)).method == "alibi"

    ev = ["eval", "--model", str(out), "--dataset", str(tiny_dir / "texts"), "--lengths", "32"]
    assert main([*ev, "--output", str(tmp_path / "eval")]) == 0
    rows = json.loads((tmp_path / "eval" / "results.json").read_text())["results"]
    assert rows[0]["method"] == "none" and rows[1]["method"].startswith("alibi")  # the base; the model as trained

    before = _snapshot(out)
    assert main(_train_args(tiny_dir, out)) == 2  # the same command again: it asks for --resume
    assert (
        "--output" in (line := _one_line_error(capsys))
        and "already holds a training run; pass --resume to continue it (with the arguments it was started with, in its train_run.json)"
        in line
    )
    assert main(_train_args(tiny_dir, out, "--resume")) == 0  # finished: nothing left to train
    assert json.loads((out / "train_summary.json").read_text())["losses"] == summary["losses"]
    assert _snapshot(out).keys() == before.keys()


def test_the_command_trains_lora_adapters_of_the_rank_asked(tiny_dir, tmp_path):
    """``--trainable lora --lora-rank 3 --lora-alpha 6``: each adapted weight moved by a rank-3 update, the summary
    says the settings; a resume with another rank is refused as another run."""
    out, base = tmp_path / "out", AutoModelForCausalLM.from_pretrained(tiny_dir / "model")
    lora = ["--trainable", "lora", "--lora-rank", "3", "--lora-alpha", "6"]
    assert main(_train_args(tiny_dir, out, *lora)) == 0
    summary = json.loads((out / "train_summary.json").read_text())["settings"]
    assert (summary["trainable"], summary["lora_rank"], summary["lora_alpha"]) == ("lora", 3, 6.0)
    trained = hf_posenc.from_pretrained(out).state_dict()
    query = "model.layers.0.self_attn.q_proj.weight"
    assert torch.linalg.matrix_rank(trained[query] - base.state_dict()[query]).item() == 3
    assert main(_train_args(tiny_dir, out, *lora[:3], "4", "--resume")) == 2
    assert main(_train_args(tiny_dir, out, *lora[:4], "--resume")) == 0  # alpha's default, 2 · 3, is the 6 given


def test_a_lora_runs_checkpoint_is_refused_as_a_model_and_resumes_the_run(tiny_dir, tmp_path, capsys):
    """A LoRA run's checkpoints hold its adapters unmerged (``base_layer``, ``lora_A``): ``from_pretrained`` and
    ``eval --model`` of one refuse it, naming the output folder (loaded, every adapted layer would be new, and score
    at chance), while the run resumes from it and its output folder loads."""
    out = tmp_path / "out"
    argv = _train_args(tiny_dir, out, "--trainable", "lora", "--steps", "2", "--save-steps", "1")
    assert main(argv) == 0
    checkpoint = out / "checkpoint-2"
    with pytest.raises(ValueError, match=r"holds the weights of peft adapter layers, not merged \(model\.layers\.0\."):
        hf_posenc.from_pretrained(checkpoint)
    capsys.readouterr()
    eval_argv = ["eval", "--model", str(checkpoint), "--dataset", str(tiny_dir / "texts"), "--lengths", "32"]
    assert main([*eval_argv, "--output", str(tmp_path / "scores")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "load the run's output folder" in err and not (tmp_path / "scores").exists()
    assert hf_posenc.get_patch(hf_posenc.from_pretrained(out)) is not None
    assert main([*argv, "--resume"]) == 0  # finished: its last checkpoint read, nothing trained


@pytest.mark.parametrize("index", ["{", '{"weight_map": {"model.layers.0.mlp.up_proj.lora_A.default.weight": "x"}}'])
def test_a_stray_index_beside_the_weights_transformers_loads_is_not_read(tmp_path, index):
    """The adapters check reads the file transformers loads, the single safetensors first: a stray index beside it,
    unreadable or naming adapters, neither fails nor refuses the load (no bare KeyError or JSONDecodeError)."""
    model = hf_posenc.patch(make_tiny("llama"), "yarn", factor=2)
    model.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(index)
    assert hf_posenc.get_patch(hf_posenc.from_pretrained(tmp_path)) == hf_posenc.get_patch(model)


def test_two_processes_train_as_one_with_the_same_total_batch_and_resume(tiny_dir, tmp_path):
    """``accelerate launch`` with 2 CPU processes (gloo), one window each, against one process with two: the same
    losses to float rounding (yarn and LoRA adapters, merged at the end). The finished run resumes on 2 processes
    (its checkpoint's RNG states, one per process, and its yarn config read by the Trainer) and is refused on 1."""
    lora = ["--method", "yarn:factor=2", "--trainable", "lora", "--lora-rank", "2", "--steps", "3", "--save-steps", "3"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(_train_args(tiny_dir, one, *lora, "--batch-size", "2")) == 0
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    command = [*launch, "-m", "hf_posenc", *_train_args(tiny_dir, two, *lora, "--batch-size", "1")]
    for extra in ([], ["--resume"]):
        done = subprocess.run([*command, *extra], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    summaries = [json.loads((folder / "train_summary.json").read_text()) for folder in (one, two)]
    assert [summary["world_size"] for summary in summaries] == [1, 2]
    for (step, a), (other, b) in zip(summaries[0]["losses"], summaries[1]["losses"], strict=True):
        assert step == other and math.isclose(a, b, rel_tol=1e-5)
    assert main([*_train_args(tiny_dir, two, *lora, "--batch-size", "1"), "--resume"]) == 2  # 1 process here


def test_streaming_reads_the_same_windows(tiny_dir, tmp_path):
    for name, extra in {"whole": (), "streamed": ("--streaming",)}.items():
        assert main(_train_args(tiny_dir, tmp_path / name, *extra)) == 0
    whole, streamed = (
        json.loads((tmp_path / name / "train_summary.json").read_text()) for name in ("whole", "streamed")
    )
    assert whole["data"] == streamed["data"]  # the same windows, token for token (their sha256)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            ["--length", "4k"],
            "error: The documents of --dataset make 581 tokens, fewer than one window of --length 4096",
        ),
        (["--length", "1"], "error: --length 1 leaves no token to predict in a window; use a --length of 2 or more"),
        (["--method", "no-such-method"], "error: Unknown method 'no-such-method'"),
        (["--warmup-steps", "-1"], "error: --warmup-steps must be a whole number, 0 or more, not -1."),
        (["--gguf-file", "missing.gguf"], "--gguf-file 'missing.gguf' is not a file in the folder"),  # as eval
        (["--model", "./no/such/folder"], "'./no/such/folder': no such file or folder (a path, not a Hub id)"),
        (["--dtype", "bfloat16", "--bf16"], "--bf16 autocast trains float32 weights; the model is in torch.bfloat16"),
        (["--seed", "-1"], "--seed must be a whole number from 0 to 2**32 - 1 (numpy's range), not -1."),
        (["--seed", str(2**32)], "--seed must be a whole number from 0 to 2**32 - 1"),
        (["--lora-alpha", "8"], "error: --lora-alpha sets the LoRA adapters of --trainable 'lora'; leave it out"),
        (["--trainable", "lora", "--lora-alpha", "0"], "--lora-alpha must be a positive number, not 0.0."),
        (["--method", "t5-bias:backend=flex"], "the flex backend has no backward on a CPU (torch's flex attention)"),
        (["--method", "self-extend:backend=flex"], "the flex backend has no backward on a CPU"),
        (
            ["--position-learning-rate", "1e-2"],
            "--position-learning-rate sets the learning rate of the position parameters the patch adds or interpolates, and --method 'alibi' has none",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tiny_dir, tmp_path, capsys, change, said):
    out = tmp_path / "out"
    assert main(_train_args(tiny_dir, out) + change) == 2
    assert said in _one_line_error(capsys) and not out.exists()


def test_an_output_inside_the_dataset_folder_is_refused_before_anything(tiny_dir, capsys):
    """Local folders are read whole: the model and checkpoints written inside would be read as data by the rerun
    with --resume (a killed run could not go on). Refused, the folder left as it was."""
    texts = tiny_dir / "texts"
    before = {path.name: path.read_bytes() for path in texts.iterdir()}
    argv = _train_args(tiny_dir, texts / "out")
    assert main(argv) == 2
    assert f"--output {texts / 'out'} is inside the --dataset folder {texts}" in _one_line_error(capsys)
    assert {path.name: path.read_bytes() for path in texts.iterdir()} == before


@pytest.mark.parametrize("method", ["alibi:backend=flex", "t5-bias:backend=flex"])
def test_a_backend_without_dropout_on_a_model_with_dropout_is_refused_before_anything(
    tiny_dir, tmp_path, capsys, method
):
    """GPT-2 trains with attention dropout (attn_pdrop 0.1), which flex has none of: refused when patching, so the
    run writes nothing (train_run.json would make the corrected command a 'resume' of it)."""
    out = tmp_path / "out"
    assert main([*_train_args(tiny_dir, out), "--model", str(tiny_dir / "gpt2"), "--method", method]) == 2
    assert f"The {method.split(':')[0]} flex backend has no attention dropout" in _one_line_error(capsys)
    assert not out.exists()
    assert main([*_train_args(tiny_dir, out), "--model", str(tiny_dir / "gpt2"), "--method", "alibi:backend=sdpa"]) == 0


@pytest.mark.parametrize(
    ("method", "params"), [("self-extend", {"group_size": 2, "window": 16}), ("alibi", {"backend": "flex"})]
)
def test_patch_refuses_a_backend_without_dropout_for_a_model_training_with_it(method, params):
    model = make_tiny("llama", attention_dropout=0.1).train()
    before = snapshot(model)
    with pytest.raises(ValueError, match="has no attention dropout, and this model is in training mode"):
        hf_posenc.patch(model, method, **params)
    assert_same(snapshot(model), before)
    hf_posenc.patch(model.eval(), method, **params)  # for inference: dropout is off
    assert hf_posenc.get_patch(model).method == method


def test_a_resume_may_spell_the_model_folder_and_the_method_otherwise(tiny_dir, tmp_path, capsys, monkeypatch):
    """The model folder relative instead of absolute, the method by its alias with a default written out: the same
    run, resumed (finished, so nothing more trains), not one of "other arguments". Another method is refused
    (the record says the spelling of the last start)."""
    out = tmp_path / "out"
    argv = _train_args(tiny_dir, out)
    argv[argv.index("--method") + 1] = "t5-bias"
    assert main(argv) == 0
    before = json.loads((out / "train_summary.json").read_text())["losses"]
    monkeypatch.chdir(tiny_dir)
    argv[argv.index("--model") + 1] = "model"
    argv[argv.index("--method") + 1] = "t5:num_buckets=32"
    assert main([*argv, "--resume"]) == 0
    assert json.loads((out / "train_summary.json").read_text())["losses"] == before
    argv[argv.index("--method") + 1] = "t5:num_buckets=16"
    assert main([*argv, "--resume"]) == 2
    assert "(--method: 't5:num_buckets=32' there, 't5:num_buckets=16' here)" in _one_line_error(capsys)


def test_an_output_of_another_run_or_other_files_is_refused(tiny_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(_train_args(tiny_dir, out, "--save-steps", "3")) == 0
    capsys.readouterr()
    before = _snapshot(out)
    assert main(_train_args(tiny_dir, out, "--save-steps", "3", "--steps", "6", "--resume")) == 2
    assert "had other arguments (--steps: 4 there, 6 here); repeat them" in _one_line_error(capsys)
    assert _snapshot(out) == before

    (other := tmp_path / "other").mkdir()
    (other / "notes.txt").write_text("mine")
    assert main(_train_args(tiny_dir, other, "--resume")) == 2
    assert f"--output {other} holds other files (no train_run.json)" in _one_line_error(capsys)
    assert _snapshot(other) == {"notes.txt": b"mine"}


def test_another_runs_check_folder_is_not_other_files(tmp_path):
    """A run starting on an empty folder while another checks it may see the other's check folder (made and removed
    to probe writability): that is no one's files, and the run does not say "holds other files"."""
    from hf_posenc.files import CHECK_PREFIX
    from hf_posenc.training.checkpoints import check_output

    (tmp_path / "out" / f"{CHECK_PREFIX}x1").mkdir(parents=True)
    check_output(tmp_path / "out", None, resume=False)
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds other files"):
        check_output(tmp_path / "out", None, resume=False)


def test_position_parameters_are_found_by_their_names_in_a_wrapped_model():
    """FSDP (version 1, original parameters kept) and activation checkpointing insert module names; FSDP without
    original parameters flattens them into one, where no rate can be set: that is refused, naming the cause."""
    from hf_posenc.training.optimizer import _split_groups, unwrapped_name

    wrapped = "_fsdp_wrapped_module.model.layers.0._checkpoint_wrapped_module.self_attn.position_bias.weight"
    assert unwrapped_name(wrapped) == "model.layers.0.self_attn.position_bias.weight"
    flat = nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.AdamW([flat], lr=1e-3)
    with pytest.raises(RuntimeError, match="FSDP without use_orig_params"):
        _split_groups(optimizer, lambda p: False, 0.5)
    assert optimizer.param_groups[0]["params"] == [flat] and optimizer.param_groups[0]["lr"] == 1e-3


def test_a_checkpoint_cut_short_is_passed_over_and_written_again(tmp_path, caplog):
    """A run stopped while the Trainer wrote a checkpoint (killed, interrupted, a full disk) leaves a folder without
    its trainer_state.json, written last: the resume names it and continues from the checkpoint before it, to the
    same weights as the run never stopped (transformers' own pick, the newest folder, would fail on the missing
    file, with the whole checkpoint before it unused)."""
    settings = _settings(batch_size=2)
    whole = make_tiny("llama")
    expected = train(whole, None, DATA, tmp_path / "whole", settings, "alibi")
    killed = tmp_path / "killed"
    with pytest.raises(KeyboardInterrupt):
        train(make_tiny("llama"), None, DATA, killed, settings, "alibi", callbacks=[_Kill(11)])
    (killed / "checkpoint-10" / "trainer_state.json").unlink()  # as the stop left it
    resumed = make_tiny("llama")
    with caplog.at_level(logging.WARNING, logger="hf_posenc.training.checkpoints"):
        result = train(resumed, None, DATA, killed, dataclasses.replace(settings, resume=True), "alibi")
    assert f"{killed / 'checkpoint-10'} was not finished (the run stopped while writing it)" in caplog.text
    assert result.losses == expected.losses
    assert all(torch.equal(a, b) for a, b in zip(whole.parameters(), resumed.parameters(), strict=True))
    assert json.loads((killed / "checkpoint-10" / "trainer_state.json").read_text())["global_step"] == 10


def test_a_checkpoint_missing_a_processs_rng_state_is_not_finished(tmp_path):
    """Each process writes its own RNG state, the others' maybe after the first process's trainer_state.json (no
    barrier): a checkpoint of a 2-process run whose second RNG file is missing or cut short is not finished (a
    resume from it would go on with another random state, only an INFO line saying so)."""
    from hf_posenc.training.checkpoints import last_checkpoint

    for step in (1, 2):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "trainer_state.json").write_text("{}")
        for rank in (0, 1):
            torch.save({"cpu": torch.random.get_rng_state()}, folder / f"rng_state_{rank}.pth")
    newest = tmp_path / "checkpoint-2" / "rng_state_1.pth"
    assert last_checkpoint(tmp_path, 2) == str(tmp_path / "checkpoint-2")
    newest.write_bytes(newest.read_bytes()[:-40])  # cut short
    assert last_checkpoint(tmp_path, 2) == str(tmp_path / "checkpoint-1")
    newest.unlink()
    assert last_checkpoint(tmp_path, 2) == str(tmp_path / "checkpoint-1")
    assert last_checkpoint(tmp_path, 1) is None  # one process writes rng_state.pth


def test_a_resume_on_another_number_of_processes_is_refused(tmp_path):
    """Each process takes its own windows of every step: a run started on 2 processes and resumed on 1 would train
    other windows, at half the batch. A run file that records no number (edited) is refused too."""
    out = tmp_path / "out"
    train(make_tiny("llama"), None, DATA, out, _settings(steps=2), "alibi")
    record = json.loads((out / "train_run.json").read_text())
    assert record["processes"] == 1
    (out / "train_run.json").write_text(json.dumps({**record, "processes": 2}))
    with pytest.raises(ValueError, match="`processes`: 2 there, 1 here"):
        train(make_tiny("llama"), None, DATA, out, _settings(steps=2, resume=True), "alibi")
    (out / "train_run.json").write_text(json.dumps({key: value for key, value in record.items() if key != "processes"}))
    with pytest.raises(ValueError, match="`processes`: None there, 1 here"):
        train(make_tiny("llama"), None, DATA, out, _settings(steps=2, resume=True), "alibi")
    (out / "train_run.json").write_text(json.dumps(record))
    resumed = train(make_tiny("llama"), None, DATA, out, _settings(steps=2, resume=True), "alibi")
    assert resumed.steps == 2 and json.loads((out / "train_run.json").read_text())["processes"] == 1


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt"])
@pytest.mark.parametrize("damage", ["truncated", "code"])
def test_a_corrupt_or_tampered_checkpoint_is_one_line_naming_the_file(tmp_path, name, damage):
    """A checkpoint's optimizer or scheduler state cut short, or replaced by a pickle that would run code: the resume
    stops with one line naming the file before anything is written, and the pickle's code never runs."""
    out, ran = tmp_path / "out", tmp_path / "code-ran"
    train(make_tiny("llama"), None, DATA, out, _settings(steps=2), "alibi")
    path = out / "checkpoint-2" / name
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        torch.save(_RunsCode(ran), path)  # torch's own format, whose pickle would run the code
    model, before = make_tiny("llama"), _snapshot(out)
    original = snapshot(model)
    with pytest.raises(ValueError, match=rf"`resume`: {re.escape(str(path))} cannot be read") as refused:
        train(model, None, DATA, out, _settings(steps=2, resume=True), "alibi")
    assert "\n" not in str(refused.value)
    assert _snapshot(out) == before and not ran.exists()
    assert_same(original, snapshot(model))


class _RunsCode:
    """Unpickled, it would create the file ``marker``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def test_settings_that_cannot_mean_what_they_say_are_one_line_before_anything_is_written(tmp_path):
    """A batch of more windows than the texts make, and LoRA adapters of a rank past the smaller side of a layer they
    adapt: refused, naming the setting, before the output folder exists; the model as it was."""
    model = make_tiny("llama")
    original = snapshot(model)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=rf"`batch_size` 64 is more windows than the texts make \({len(DATA)} of 32"):
        train(model, None, DATA, out, _settings(steps=1, batch_size=64), "alibi")
    smallest = min(min(m.weight.shape) for m in model.modules() if isinstance(m, nn.Linear) and m is not model.lm_head)
    with pytest.raises(ValueError, match=rf"`lora_rank` {smallest + 1} is more than the smaller side of the layer "):
        train(model, None, DATA, out, _settings(steps=1, trainable="lora", lora_rank=smallest + 1), "alibi")
    assert not out.exists()
    assert_same(original, snapshot(model))


def test_settings_that_run_anyway_are_one_line_notices(tmp_path, caplog):
    """``resume`` where no run is yet starts one, and ``trainable`` 'position' with a method that adds no position
    parameter trains the norms alone: each said in one line, and the run trains."""
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="hf_posenc"):
        result = train(make_tiny("llama"), None, DATA, out, _settings(steps=1, trainable="position", resume=True),
                       "yarn:factor=2")  # fmt: skip
    notices = [record.getMessage() for record in caplog.records if record.name.startswith("hf_posenc.training")]
    assert f"`resume`: {out} holds no run yet; starting one." in notices
    assert (
        "yarn:factor=2 adds no position parameters to LlamaForCausalLM: `trainable` 'position' trains its "
        "normalisation weights only." in notices
    )
    assert result.steps == 1


def test_a_resume_while_the_run_trains_is_refused_untouched(tmp_path):
    """The run's first process holds a lock in the folder while it trains: a second run resuming there meanwhile
    (the processes of a killed launcher train on) is refused before it changes a file or the model; the lock file a
    run leaves behind is no other run's file, and no lock once its process ends."""
    from hf_posenc.files import try_lock
    from hf_posenc.training.checkpoints import RUN_LOCK

    out = tmp_path / "out"
    train(make_tiny("llama"), None, DATA, out, _settings(steps=2), "alibi")
    holder = try_lock(out / RUN_LOCK)  # another run, training now
    model, before = make_tiny("llama"), _snapshot(out)
    original = snapshot(model)
    with pytest.raises(ValueError, match="another run is training in `output_dir` .* now"):
        train(model, None, DATA, out, _settings(steps=2, resume=True), "alibi")
    assert _snapshot(out) == before
    assert_same(original, snapshot(model))
    os.close(holder)
    assert train(make_tiny("llama"), None, DATA, out, _settings(steps=2, resume=True), "alibi").steps == 2
    killed = tmp_path / "killed"  # killed between taking the lock and writing its record
    killed.mkdir()
    (killed / RUN_LOCK).touch()
    assert train(make_tiny("llama"), None, DATA, killed, _settings(steps=1), "alibi").steps == 1


def test_a_resume_on_other_weights_or_another_dtype_is_refused(tmp_path):
    """The run's record names the weights as handed in (dtype and fingerprint): a resume with the model in another
    dtype, or other weights under the same name (another GGUF file of the folder), is refused, naming it, and
    nothing is written; so is a run file that records no weights (edited). The same model resumes."""
    settings = _settings(steps=2, save_steps=1)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        train(make_tiny("llama"), None, DATA, out, settings, "alibi", callbacks=[_Kill(1)])
    before = _snapshot(out)
    resumed = dataclasses.replace(settings, resume=True)
    with pytest.raises(ValueError, match=r"`dtype`: 'float32' there, 'bfloat16' here"):
        train(make_tiny("llama").to(torch.bfloat16), None, DATA, out, resumed, "alibi")
    with pytest.raises(ValueError, match=r"the model's weights differ \(another checkpoint or GGUF file"):
        train(make_tiny("llama", seed=1), None, DATA, out, resumed, "alibi")
    assert _snapshot(out) == before
    run_file = out / "train_run.json"
    recorded = run_file.read_text()
    run_file.write_text(json.dumps({key: value for key, value in json.loads(recorded).items() if key != "weights"}))
    with pytest.raises(ValueError, match=r"`dtype`: None there, 'float32' here"):
        train(make_tiny("llama"), None, DATA, out, resumed, "alibi")
    run_file.write_text(recorded)
    assert train(make_tiny("llama"), None, DATA, out, resumed, "alibi").steps == 2


def test_a_full_disk_is_one_line_and_the_run_resumes_after(tiny_dir, tmp_path, capsys, monkeypatch):
    """Writing a checkpoint's weights fails (safetensors' own error for a full disk, not an OSError): one line, exit 2,
    not a traceback; once there is room, --resume passes over the checkpoint cut short and finishes."""
    import transformers.modeling_utils as modeling_utils
    from safetensors import SafetensorError

    out, save = tmp_path / "out", modeling_utils.safe_save_file

    def full(tensors, filename, *args, **kwargs):
        if "checkpoint-2" in str(filename):
            Path(filename).write_bytes(b"\0" * 8)  # what reached the disk
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return save(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(modeling_utils, "safe_save_file", full)
    argv = _train_args(tiny_dir, out, "--steps", "3", "--save-steps", "1")
    assert main(argv) == 2
    assert "error: Error while serializing: I/O error: No space left on device" in _one_line_error(capsys)
    monkeypatch.setattr(modeling_utils, "safe_save_file", save)
    assert main([*argv, "--resume"]) == 0
    assert json.loads((out / "train_summary.json").read_text())["steps"] == 3


def test_the_model_trained_keeps_its_cache_setting(tmp_path):
    """The Trainer turns ``use_cache`` off on the model's config for training; the model handed back, and the one
    saved, generate with their KV cache as the base did (the saved config does not say ``use_cache: false``), also
    after a run stopped midway."""
    model = make_tiny("llama")
    assert model.config.use_cache is True
    train(model, None, DATA, tmp_path / "out", _settings(steps=2, save_steps=1), "alibi")
    assert model.config.use_cache is True
    assert json.loads((tmp_path / "out" / "config.json").read_text())["use_cache"] is True
    stopped = make_tiny("llama")
    with pytest.raises(KeyboardInterrupt):
        train(
            stopped, None, DATA, tmp_path / "stopped", _settings(steps=2, save_steps=1), "alibi", callbacks=[_Kill(1)]
        )
    assert stopped.config.use_cache is True


@pytest.mark.parametrize(("text", "said"), [("{broken", "not JSON: Expecting"), ("[1, 2]", "JSON, but not an object")])
def test_a_damaged_run_record_is_refused_naming_it(tmp_path, text, said):
    out = tmp_path / "out"
    train(make_tiny("llama"), None, DATA, out, _settings(steps=1, save_steps=1), "alibi")
    (out / "train_run.json").write_text(text)
    before = _snapshot(out)
    resumed = _settings(steps=1, save_steps=1, resume=True)
    with pytest.raises(
        ValueError, match=rf"`resume`: {re.escape(str(out / 'train_run.json'))} is not the record of a run \({said}"
    ):
        train(make_tiny("llama"), None, DATA, out, resumed, "alibi")
    assert _snapshot(out) == before


def test_an_output_folder_that_cannot_be_written_is_refused_before_anything_loads(
    tiny_dir, tmp_path, capsys, monkeypatch
):
    """A read-only place (a read-only mount: root, as the tests may run, passes permission bits) is named before the
    model and the data load, not met as a bare "[Errno 30] Read-only file system" after both."""
    import tempfile

    read_only, make = tmp_path / "mount", tempfile.mkdtemp
    read_only.mkdir()

    def mkdtemp(*args, dir, **kwargs):
        if Path(dir) == read_only:
            raise OSError(30, "Read-only file system")
        return make(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("loaded"))
    assert main(_train_args(tiny_dir, read_only / "run")) == 2
    assert f"--output {read_only / 'run'} cannot be written: {read_only} is not writable" in _one_line_error(capsys)
    assert main(_train_args(tiny_dir, read_only)) == 2
    assert f"--output {read_only} cannot be written; choose a folder you can write to." in _one_line_error(capsys)


def test_training_on_from_a_saved_t5_model_takes_its_table_or_says_why_not(tmp_path, caplog):
    """A saved t5-bias model trained on with its own method starts from its trained table; with other parameters
    the table cannot serve, and a warning says that training starts afresh."""
    from hf_posenc.eval.models import ModelSource, load_model
    from hf_posenc.spec import MethodSpec
    from hf_posenc.training.trainable import apply_method

    saved = tmp_path / "saved"
    trained = make_tiny("llama")
    train(trained, None, DATA, saved, _settings(steps=2, save_steps=1, learning_rate=0.5), "t5-bias:num_buckets=8")
    table = trained.model.position_bias.weight.detach().clone()
    source = ModelSource(str(saved))

    def loaded():
        return load_model(source, torch.device("cpu"), source.saved_patch())

    same, other = loaded(), loaded()

    def notes() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "hf_posenc.training.trainable"]

    with caplog.at_level(logging.WARNING, logger="hf_posenc.training.trainable"):
        apply_method(same, MethodSpec.parse("t5-bias:num_buckets=8"))
        assert not notes()
        apply_method(other, MethodSpec.parse("t5-bias:num_buckets=16"))
    assert torch.equal(same.model.position_bias.weight, table)
    [note] = notes()
    assert "saved with trained model.position_bias.weight of another method or parameters than" in note
    assert other.model.position_bias.weight.shape == (16, 4)


def test_bf16_is_compared_as_the_run_trains_not_as_asked(tmp_path):
    """A run started with the default (on a CPU: no autocast) resumes with --no-bf16 said out loud, and not with
    --bf16, which would change how it trains. A run file that records no bf16 as the run trains (edited) is
    refused."""
    settings = _settings(steps=2, save_steps=1)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        train(make_tiny("llama"), None, DATA, out, settings, "alibi", callbacks=[_Kill(1)])
    with pytest.raises(ValueError, match=r"`bf16`: False there, True here"):
        train(make_tiny("llama"), None, DATA, out, dataclasses.replace(settings, resume=True, bf16=True), "alibi")
    said = dataclasses.replace(settings, resume=True, bf16=False)
    assert train(make_tiny("llama"), None, DATA, out, said, "alibi").steps == 2
    run_file = out / "train_run.json"
    recorded = json.loads(run_file.read_text())
    del recorded["bf16"]
    run_file.write_text(json.dumps(recorded))
    with pytest.raises(ValueError, match=r"`bf16`: None there, False here"):
        train(make_tiny("llama"), None, DATA, out, dataclasses.replace(settings, resume=True), "alibi")


def test_a_warmup_as_long_as_the_run_is_warned_of(tmp_path, caplog):
    """The learning rate would not reach its peak: a warning (a run started so before still resumes)."""
    with caplog.at_level(logging.WARNING, logger="hf_posenc.training.run"):
        train(make_tiny("llama"), None, DATA, tmp_path / "out", _settings(steps=2, warmup_steps=2), "alibi")
    assert "warmup_steps 2 is not below steps 2: the learning rate does not reach learning_rate 0.001" in caplog.text
