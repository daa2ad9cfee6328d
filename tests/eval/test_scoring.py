"""One forward per document serves every truncate length: each shorter window's NLL read from the forward of
the longest equals a forward of that window alone (float32, relative 1e-5), for every method and base model
whose output at a position does not depend on the input's length; the others keep one forward per length."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from helpers import SPECS, family_of
from tiny_models import make_tiny
from transformers import AutoModelForCausalLM, GPTNeoXConfig

import hf_posenc
from hf_posenc.architectures import depends_on_length
from hf_posenc.cli import main
from hf_posenc.eval import runner, scoring
from hf_posenc.eval.data import build_windows
from hf_posenc.eval.scoring import plan_forwards, score_lengths, serves_every_length
from hf_posenc.registry import Method, available_methods, get_method
from hf_posenc.spec import MethodSpec

ROOT = Path(__file__).resolve().parents[2]
DYNAMIC = {"dynamic-ntk", "dynamic-yarn", "longrope"}
DOC_LENGTHS = [150, 90, 20, 171]  # the 20-token document is too short for 40, the 90-token one for 100


def _docs(seed: int = 11) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 97, (n,), generator=generator).tolist() for n in DOC_LENGTHS]


def _patched(model, text: str) -> AbstractContextManager:
    spec = MethodSpec.parse(text)
    return nullcontext() if spec.unpatched else hf_posenc.patched(model, spec.method, **spec.params)


def test_every_registered_method_says_whether_it_depends_on_the_length():
    assert sorted(SPECS) == available_methods()
    assert {name for name in SPECS if get_method(name).depends_on_length} == DYNAMIC


def test_a_dynamic_method_cannot_say_it_does_not_depend_on_the_length():
    with pytest.raises(ValueError, match="'x' is dynamic, so its output depends on the input's length"):
        Method(name="x", params=object, dynamic=True, depends_on_length=False)


def _prefix_gap(model, length: int, prefix: int) -> float:
    """Largest difference between the logits of the first ``prefix`` positions of a ``length``-token forward and
    those of a forward of the ``prefix`` tokens alone."""
    ids = torch.randint(0, 97, (1, length), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        return (model(ids).logits[:, :prefix] - model(ids[:, :prefix]).logits).abs().max().item()


@pytest.mark.parametrize("method", sorted(SPECS))
def test_the_flag_is_what_a_forward_shows(method):
    """Past the tiny Llama's 64 positions, the logits (|logit| < 1) of the first 40 positions of a 128-token
    forward equal those of a 40-token forward where the method says it does not depend on the length, and
    differ where it says it does."""
    model = make_tiny(family_of(method))
    with _patched(model, SPECS[method]):
        gap = _prefix_gap(model, 128, 40)
    assert gap > 1e-3 if get_method(method).depends_on_length else gap < 1e-6


@pytest.mark.parametrize(
    ("family", "rope", "depends"),
    [
        ("llama", {"rope_type": "default", "rope_theta": 1e4}, False),
        (
            "qwen2",
            {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0, "original_max_position_embeddings": 32},
            False,
        ),
        ("llama", {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}, True),
        ("gpt2", None, False),
    ],
)
def test_the_base_model_decides_for_none(family, rope, depends):
    """A model whose own RoPE is dynamic is scored one forward per length even unpatched: its prefix losses
    differ from a forward of the prefix alone."""
    model = make_tiny(family) if rope is None else make_tiny(family, rope_parameters=rope)
    assert depends_on_length(model) == depends and serves_every_length(model, "none") != depends
    assert not serves_every_length(model, "dynamic-ntk")
    gap = _prefix_gap(model, 64 if family == "gpt2" else 128, 40)
    assert gap > 1e-3 if depends else gap < 1e-6


def test_families_it_does_not_list_are_scored_one_forward_per_length():
    config = GPTNeoXConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4
    )
    model = AutoModelForCausalLM.from_config(config)
    assert depends_on_length(model) and not serves_every_length(model, "yarn")


def _scores(model, docs, lengths, bos_id, *, together: bool, max_windows=None, batch_size=1):
    plans = {
        n: build_windows(DOC_LENGTHS, n, "truncate", bos=bos_id is not None, max_windows=max_windows) for n in lengths
    }
    windows = {n: plan.windows for n, plan in plans.items()}
    kwargs = dict(accelerator=Accelerator(cpu=True), bos_id=bos_id, batch_size=batch_size, chunk_size=7)
    if together:
        return score_lengths(model, docs, windows, **kwargs)
    return {n: score_lengths(model, docs, {n: windows[n]}, **kwargs)[n] for n in lengths}


CASES = [(family_of(name), name) for name in sorted(set(SPECS) - DYNAMIC)] + [("llama", "none")]
CASES += [("gpt2", "none"), ("gpt2", "pi:factor=2"), ("gpt2", "alibi")]


@pytest.mark.parametrize("bos_id", [None, 1])
@pytest.mark.parametrize(("family", "method"), CASES)
def test_shorter_lengths_read_from_one_forward_equal_their_own_forwards(family, method, bos_id):
    lengths = [16, 40, 64] if family == "gpt2" else [16, 40, 100]
    model, docs, text = make_tiny(family), _docs(), SPECS.get(method, method)
    assert serves_every_length(model, MethodSpec.parse(text).method)
    with _patched(model, text):
        together = _scores(model, docs, lengths, bos_id, together=True)
        alone = _scores(model, docs, lengths, bos_id, together=False)
    for n in lengths:
        assert len(together[n].windows) == len(alone[n].windows)
        for (nll, tokens), (nll_alone, tokens_alone) in zip(together[n].windows, alone[n].windows, strict=True):
            assert tokens == tokens_alone and math.isclose(nll, nll_alone, rel_tol=1e-5)
        assert alone[n].forwards == len(alone[n].windows) and alone[n].derived_from is None
    longest, middle, short = lengths[::-1]
    assert together[longest].windows == alone[longest].windows  # the same forwards, bit for bit
    # the 90-token document is read at 40 (and serves 16 too), the 20-token one at 16 only
    fits_longest = sum(n >= longest - (bos_id is not None) for n in DOC_LENGTHS)
    assert (together[longest].forwards, together[longest].derived_from) == (fits_longest, None)
    assert (together[middle].forwards, together[middle].derived_from) == (3 - fits_longest, longest)
    assert (together[short].forwards, together[short].derived_from) == (1, longest)


def test_windows_cut_by_max_windows_and_batched_still_equal_their_own_forwards():
    """--max-windows 2: the longest length reads documents 0 and 3, the shorter ones 0 and 1; two windows a
    forward where they have one shape."""
    model, docs = make_tiny("qwen2"), _docs(seed=12)
    together = _scores(model, docs, [16, 40, 100], None, together=True, max_windows=2, batch_size=2)
    alone = _scores(model, docs, [16, 40, 100], None, together=False, max_windows=2, batch_size=2)
    for n in (16, 40, 100):
        assert [t for _, t in together[n].windows] == [t for _, t in alone[n].windows] and len(together[n].windows) == 2
        for (nll, _), (nll_alone, _) in zip(together[n].windows, alone[n].windows, strict=True):
            assert math.isclose(nll, nll_alone, rel_tol=1e-5)
    assert [(s.forwards, s.derived_from) for s in together.values()] == [(0, 100), (1, 100), (2, None)]


def test_a_non_finite_loss_past_a_shorter_window_is_not_read_into_it(monkeypatch):
    """A NaN embedding at token 60 of the 150-token document makes every position of the 100-token forward NaN
    (the causal mask is added to the logits): the 16- and 40-token windows of that document are read from forwards
    of their own, and equal them. The other documents keep sharing the longest forward."""
    model, docs = make_tiny("llama"), _docs()
    docs[0][60] = 1
    with torch.no_grad():
        model.get_input_embeddings().weight[1] = float("nan")
    ticks = iter(range(1000))  # a clock that ticks once a reading, as in the test below
    with monkeypatch.context() as clock:
        clock.setattr(scoring.time, "perf_counter", lambda: float(next(ticks)))
        together = _scores(model, docs, [16, 40, 100], None, together=True)
    # 1 s a forward, to the length it was run at (the two read again alone too), the rest of the pass to 100
    assert {n: score.seconds for n, score in together.items()} == {16: 2.0, 40: 2.0, 100: 9.0}
    alone = _scores(model, docs, [16, 40, 100], None, together=False)
    assert math.isnan(together[100].windows[0][0]) and math.isnan(alone[100].windows[0][0])
    for n in (16, 40):
        assert all(math.isfinite(nll) for nll, _ in together[n].windows)
        for (nll, tokens), (nll_alone, tokens_alone) in zip(together[n].windows, alone[n].windows, strict=True):
            assert tokens == tokens_alone and math.isclose(nll, nll_alone, rel_tol=1e-5)
    # 100: documents 0 and 3; 40: document 0 alone, document 1 (90 tokens) its own length; 16: document 0 alone,
    # document 2 (20 tokens) its own length, and documents 1 and 3 from longer forwards
    assert [(s.forwards, s.derived_from) for s in together.values()] == [(2, 100), (2, 100), (2, None)]


def test_seconds_go_to_the_length_each_forward_was_run_at(monkeypatch):
    """A clock that ticks once a reading: each forward (one a batch) adds 1 s to its own length; the rest of
    the pass (before the first and after the last forward, gathering) goes to the longest length."""
    ticks = iter(range(1000))
    monkeypatch.setattr(scoring.time, "perf_counter", lambda: float(next(ticks)))
    scores = _scores(make_tiny("llama"), _docs(), [16, 40, 100], None, together=True)
    # forwards: document 0 at 100, 1 at 40, 2 at 16, 3 at 100: 10 readings, 9 s in all
    assert {n: score.seconds for n, score in scores.items()} == {16: 1.0, 40: 1.0, 100: 7.0}


def test_plan_forwards_shares_only_windows_that_are_prefixes_of_one_another():
    plans = {n: build_windows([50, 200], n, "sliding", bos=False, stride=n // 2).windows for n in (20, 40)}
    forwards = plan_forwards(plans)
    for forward in forwards:
        for n, k in forward.serves:
            window = plans[n][k]
            assert (window.doc, window.start, window.score_from) == (
                forward.window.doc,
                forward.window.start,
                forward.window.score_from,
            )
            assert window.end <= forward.window.end
    served = sorted(pair for forward in forwards for pair in forward.serves)
    assert served == sorted((n, k) for n, windows in plans.items() for k in range(len(windows)))
    assert len(forwards) < sum(map(len, plans.values()))  # the first windows of each document are shared


def _run(tiny_dir: Path, output: Path, methods: list[str], lengths: str, *extra: str) -> dict:
    argv = ["eval", "--model", str(tiny_dir / "model"), "--dataset", str(tiny_dir / "texts")]
    argv += ["--output", str(output), "--lengths", lengths, "--protocol", "truncate", *extra]
    assert main(argv + [arg for method in methods for arg in ("--method", method)]) == 0
    return json.loads((output / "results.json").read_text())


def _calls(monkeypatch) -> list[str]:
    calls, original = [], runner.score_lengths
    monkeypatch.setattr(
        runner, "score_lengths", lambda *a, desc, **k: calls.append(desc) or original(*a, desc=desc, **k)
    )
    return calls


def _table(printed: str, methods: list[str]) -> list[str]:
    return [line for line in printed.splitlines() if line.split(" ")[0] in ("method", *methods)]


def test_the_run_reads_lengths_from_one_forward_except_for_dynamic_methods(tiny_dir, tmp_path, monkeypatch, capsys):
    """The same rows, to 1e-5, with and without --one-forward-per-length, and the same printed table."""
    methods = ["none", "yarn:factor=2", "dynamic-ntk:factor=2"]
    calls = _calls(monkeypatch)
    derived = _run(tiny_dir, tmp_path / "derived", methods, "16,48,128")["results"]
    printed = capsys.readouterr().out
    assert calls == [
        "none @ 16,48,128",
        "yarn:factor=2 @ 16,48,128",
        "dynamic-ntk:factor=2 @ 16",
        "dynamic-ntk:factor=2 @ 48",
        "dynamic-ntk:factor=2 @ 128",
    ]
    calls.clear()
    separate = _run(tiny_dir, tmp_path / "separate", methods, "16,48,128", "--one-forward-per-length")["results"]
    printed_separate = capsys.readouterr().out
    assert len(calls) == 9
    same = ("method", "length", "tokens", "windows", "skipped_documents", "dropped_tokens")
    for row, alone in zip(derived, separate, strict=True):
        assert [row[key] for key in same] == [alone[key] for key in same]
        assert math.isclose(row["nll"], alone["nll"], rel_tol=1e-5)
        assert alone["derived_from"] is None and alone["forwards"] == alone["windows"]
    # documents of 300, 90, 20 and 171 characters: 300 and 171 are read at 128, 90 at 48, 20 at 16
    how = [(r["method"], r["length"], r["forwards"], r["derived_from"]) for r in derived]
    assert how[:6] == [(m, *rest) for m in methods[:2] for rest in [(16, 1, 128), (48, 1, 128), (128, 2, None)]]
    assert how[6:] == [("dynamic-ntk:factor=2", n, windows, None) for n, windows in [(16, 4), (48, 3), (128, 2)]]
    assert len(_table(printed, methods)) == 4 and _table(printed, methods) == _table(printed_separate, methods)
    assert (
        "16, 48 derived from the 128 forward of each document for none, yarn:factor=2; the other rows: one forward "
        "per length (see --help)." in printed
    )
    assert "derived" not in printed_separate


def test_resume_reads_the_missing_lengths_from_the_longest_missing_one(tiny_dir, tmp_path, monkeypatch, capsys):
    first = _run(tiny_dir, tmp_path / "out", ["none"], "48")["results"]
    calls = _calls(monkeypatch)
    rows = _run(tiny_dir, tmp_path / "out", ["none"], "16,48,96")["results"]
    assert calls == ["none @ 16,96"]
    assert rows[1] == first[0]  # kept as it was
    assert [(r["length"], r["derived_from"]) for r in rows] == [(16, 96), (48, None), (96, None)]
    assert "16 derived from the 96 forward of each document (one forward per document; see --help)." in (
        capsys.readouterr().out
    )


def test_two_processes_read_the_same_lengths_from_the_same_forwards(tiny_dir, tmp_path):
    """Four forwards (two at 128, one at 48, one at 16) split over 2 CPU processes (gloo), gathered once."""
    methods = ["none", "dynamic-ntk:factor=2"]
    one = _run(tiny_dir, tmp_path / "one", methods, "16,48,128")
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    data = ["--model", str(tiny_dir / "model"), "--dataset", str(tiny_dir / "texts")]
    data += ["--output", str(tmp_path / "two"), "--lengths", "16,48,128", "--protocol", "truncate"]
    command = launch + ["-m", "hf_posenc", "eval", *data, "--method", methods[0], "--method", methods[1]]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    two = json.loads((tmp_path / "two" / "results.json").read_text())
    assert two["processes"] == 2
    keys = ("method", "length", "tokens", "windows", "forwards", "derived_from")
    for a, b in zip(one["results"], two["results"], strict=True):
        assert [a[key] for key in keys] == [b[key] for key in keys]
        assert math.isclose(a["nll"], b["nll"], rel_tol=1e-9)
    assert [r["derived_from"] for r in two["results"]] == [128, 128, None, None, None, None]


def test_help_says_how_truncate_reads_its_lengths(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--one-forward-per-length truncate: a forward for every length, not shorter lengths read" in text
    assert "reads a document at the longest length it fits, once, and takes each shorter length's losses" in text
    assert (
        "methods none and yarn:factor=4 at 2k,8k,16k, one truncate window per length (the first LENGTH tokens), all read from one 16k forward per method"
        in text
    )


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_progress_bar_moves_with_each_layer_of_a_forward(family, capfd, monkeypatch):
    """One long forward (a 16k window on a CPU: minutes) showed 0/1 until it ended: the bar counts the model's layers,
    one step a layer, and ends at every layer of every forward."""
    model = make_tiny(family)
    layers = model.config.num_hidden_layers
    ticks = []
    original = scoring._LayerProgress._tick

    def tick(self, *args):  # returns None: a forward hook's value would replace the layer's output
        ticks.append(self.bar.n)
        original(self, *args)

    monkeypatch.setattr(scoring._LayerProgress, "_tick", tick)
    _scores(model, _docs(), [16, 40, 64], together=True, bos_id=None, batch_size=1)
    err = capfd.readouterr().err
    forwards = 4  # three documents read at 64 (serving 16 and 40), the 20-token one at 16
    assert ticks == list(range(forwards * layers))
    assert f"(4 forwards of {layers} layers)" in err and f"{forwards * layers}/{forwards * layers}" in err
    assert not any(layer._forward_hooks for layer in model.modules())  # removed after


def test_the_bar_counts_the_decoders_layers_only_and_forwards_on_a_gpu(capfd, monkeypatch):
    """transformers merges the vision tower's blocks into a multimodal model's ``_no_split_modules`` (Gemma 3 loads as
    ``…ForConditionalGeneration``): text scoring never runs them, so the bar counts the decoder's only (counting
    them, it would end at 4/14). On a GPU a layer's hook runs when its kernels are queued: the bar counts forwards
    there."""
    from transformers import Gemma3Config

    text = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4)
    text |= dict(num_key_value_heads=2, head_dim=16, max_position_embeddings=128)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2, image_size=28)
    config = Gemma3Config(text_config=text, vision_config=dict(vision, patch_size=14), mm_tokens_per_image=4)
    model = AutoModelForCausalLM.from_config(config).eval()
    assert "SiglipEncoderLayer" in model._no_split_modules
    _scores(model, _docs(), [16, 40], together=True, bos_id=None)
    last = capfd.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert "(4 forwards of 2 layers)" in last and "8/8" in last
    monkeypatch.setattr(scoring, "input_device", lambda model: torch.device("cuda", 0))
    progress = scoring._LayerProgress(model, 3, "x", shown=True)
    assert (progress.layers, progress.bar.total, progress.bar.unit) == ([], 3, "forward")
    progress.bar.close()
