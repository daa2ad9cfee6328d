"""A tune on the tiny model: its ranking is the perplexity run's numbers read as the issue says (regression against
the unpatched model, ties by paired standard errors), it resumes, a budget screens, and bad input is refused before
anything is written."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from tiny_models import make_tiny
from transformers import AutoModelForCausalLM

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.eval import ModelSource, TextSource
from hf_posenc.eval import runner as eval_runner
from hf_posenc.eval.data import build_windows
from hf_posenc.eval.scoring import score_lengths
from hf_posenc.reports.tune_report import TuneReport
from hf_posenc.tuning import TuneConfig, run_tune
from hf_posenc.tuning.statistics import Z


def _tune(tiny_dir, output, **config):
    source, texts = ModelSource(str(tiny_dir / "model")), TextSource(str(tiny_dir / "texts"))
    return run_tune(source, texts, TuneConfig(**{"logn": False, **config}), output)


@pytest.fixture(scope="module")
def tuned(tiny_dir, tmp_path_factory):
    """One tune, read by the tests of its ranking and of its winner."""
    output = tmp_path_factory.mktemp("tuned")
    return _tune(tiny_dir, output, methods=["yarn", "rerope", "dca"], max_regression=0.001), output


def test_the_ranking_is_the_perplexity_runs_numbers(tuned):
    report, tmp_path = tuned
    rows = {
        (r["method"], r["length"]): r for r in json.loads((tmp_path / "perplexity/results.json").read_text())["results"]
    }
    assert (report.trained_context, report.target_length, report.short_lengths) == (64, 128, [16, 64])
    for row in report.rows:
        measured = rows[(row.method, 128)]
        assert (row.ppl, row.nll) == (measured["ppl"], measured["nll"])
        blocks = measured["blocks"]
        assert sum(s for s, _ in blocks) == pytest.approx(measured["nll"] * measured["tokens"], rel=1e-9)
        assert sum(n for _, n in blocks) == measured["tokens"] and len(blocks) == 8 * measured["windows"]
        for n in (16, 64):
            ratio = math.exp(rows[(row.method, n)]["nll"] - rows[("none", n)]["nll"])
            assert row.regression[n] == pytest.approx(ratio, rel=1e-12)
        assert row.eligible == (max(row.regression.values()) <= 1.001)
    eligible = [row for row in report.rows if row.eligible]
    best = min(eligible, key=lambda row: row.nll)
    assert report.best.text == best.method and report.rows[0] is not None and report.rows[0].method == best.method
    for row in eligible[1:]:  # the paired difference to the best, block by block, written out
        pairs = zip(rows[(row.method, 128)]["blocks"], rows[(best.method, 128)]["blocks"], strict=True)
        diffs = [((a - b) / n, n) for (a, n), (b, _) in pairs]
        total = sum(n for _, n in diffs)
        mean = sum(d * n for d, n in diffs) / total
        error = math.sqrt(len(diffs) / (len(diffs) - 1) * sum(n * n * (d - mean) ** 2 for d, n in diffs)) / total
        assert row.difference == pytest.approx(mean, rel=1e-9, abs=1e-15)
        assert row.tied == (abs(mean) <= Z * error) and (row.rank == 1) == row.tied
    assert [row.method for row in report.rows if not row.eligible] == [
        row.method for row in sorted(report.rows, key=lambda row: row.nll) if not row.eligible
    ]
    read = TuneReport.read(tmp_path / "tune.json")
    assert read.to_json() == report.to_json() and read.best == report.best
    assert (tmp_path / "tune.csv").read_text().splitlines()[0].startswith("rank,method,family,ppl")
    assert (tmp_path / "tune.png").read_bytes()[:4] == b"\x89PNG"


def test_the_winner_is_a_config_only_folder_that_loads_as_the_base_patched(tiny_dir, tuned):
    report, tmp_path = tuned
    assert report.best is not None
    best = tmp_path / "best"
    assert not list(best.glob("*.safetensors")) and (best / "tokenizer.json").is_file()
    metadata = json.loads((best / "hf_posenc.json").read_text())
    assert (metadata["weights"], metadata["base_model"]) == (False, str(tiny_dir / "model"))
    card = (best / "README.md").read_text()
    assert f"`{report.best.text}" in card and report.table() in card
    loaded = hf_posenc.from_pretrained(str(best)).eval()
    assert hf_posenc.get_patch(loaded).method == report.best.method
    assert loaded.config.max_position_embeddings >= 128  # the target, what serving engines read
    base = AutoModelForCausalLM.from_pretrained(tiny_dir / "model").eval()
    ids = torch.randint(2, 97, (1, 100))
    with hf_posenc.patched(base, report.best), torch.no_grad():
        assert torch.equal(loaded(ids).logits, base(ids).logits)


def test_blocks_read_from_a_longer_forward_equal_each_blocks_own_nll():
    """A 40-token window read from the 64-token forward: its 4 blocks are its tokens' NLLs summed, computed alone."""
    torch.manual_seed(0)
    model = make_tiny("llama")
    doc = torch.randint(2, 97, (64,)).tolist()
    plans = {n: build_windows([64], n, "truncate", bos=False).windows for n in (40, 64)}
    scores = score_lengths(model, [doc], plans, accelerator=Accelerator(cpu=True), blocks=4)
    assert scores[40].derived_from == 64
    with torch.no_grad():
        logits = model(torch.tensor([doc[:40]])).logits[0]
    nll = F.cross_entropy(logits[:-1].double(), torch.tensor(doc[1:40]), reduction="none")  # 39 scored tokens
    sizes = [n for _, n in scores[40].blocks]
    assert sizes == [10, 10, 9, 10]  # round(39 k / 4)
    bounds = [0, 10, 20, 29, 39]
    for (value, _), start, end in zip(scores[40].blocks, bounds, bounds[1:], strict=False):
        assert value == pytest.approx(nll[start:end].sum().item(), rel=1e-5)


def test_a_rerun_with_more_families_computes_only_the_new_candidates(tiny_dir, tmp_path, monkeypatch):
    first = _tune(tiny_dir, tmp_path, methods=["yarn"])
    calls, original = [], eval_runner.score_lengths
    monkeypatch.setattr(
        eval_runner, "score_lengths", lambda *a, desc, **k: calls.append(desc) or original(*a, desc=desc, **k)
    )
    second = _tune(tiny_dir, tmp_path, methods=["yarn", "rerope"])
    assert {desc.split(" @ ")[0] for desc in calls} == {"rerope", "rerope:window=16"}
    kept = {row.method: row.ppl for row in first.rows}
    assert {row.method: row.ppl for row in second.rows if row.method in kept} == kept


def test_passkey_accuracy_is_the_passkey_runs_own(tiny_dir, tmp_path, capsys, monkeypatch):
    """A passkey prompt of the character tokenizer needs 339 tokens: a target of 400, on two longer texts."""
    texts = tmp_path / "texts"
    texts.mkdir()
    for i in range(2):
        (texts / f"{i}.txt").write_text("the grass is green. " * 30)
    output = tmp_path / "out"
    argv = ["tune", "--model", str(tiny_dir / "model"), "--dataset", str(texts), "--no-logn", "--methods", "rerope"]
    assert main([*argv, "--target-length", "200", "--passkey", "1", "--output", str(output)]) == 2
    assert "Length 200 is too short for a passkey prompt" in capsys.readouterr().err and not output.exists()
    assert main([*argv, "--target-length", "400", "--passkey", "1", "--output", str(output)]) == 0
    report = TuneReport.read(output / "tune.json")
    trials = json.loads((output / "passkey/passkey.json").read_text())["trials"]
    for row in report.rows:
        mine = [trial["correct"] for trial in trials if trial["method"] == row.method and trial["length"] == 400]
        assert len(mine) == row.passkey_trials == 3  # one key at each of 3 depths
        assert row.passkey == sum(mine) / 3
        assert row.passkey_error == pytest.approx(math.sqrt(row.passkey * (1 - row.passkey) / 3))
    assert "passkey" in capsys.readouterr().out.split("best first:\n")[1].splitlines()[0]  # the header
    calls = []
    monkeypatch.setattr(eval_runner, "score_lengths", lambda *a, **k: calls.append(a))
    assert main([*argv, "--target-length", "400", "--passkey", "2", "--output", str(output)]) == 2  # other keys
    assert "holds results of different arguments (trials: 1 then, 2 now)" in capsys.readouterr().err and not calls


def test_a_budget_keeps_the_best_of_the_screening(tiny_dir, tmp_path):
    report = _tune(tiny_dir, tmp_path, methods=["yarn", "ntk", "rerope"], budget=2, max_regression=1.0)
    assert report.screening_length == 96 and len(report.rows) == 2 and len(report.screened_out) == 4
    screened = json.loads((tmp_path / "screening/results.json").read_text())
    assert {r["windows"] for r in screened["results"] if r["length"] == 96} == {1}
    at = {r["method"]: r["nll"] for r in screened["results"] if r["length"] == 96 and r["method"] != "none"}
    assert {row.method for row in report.rows} == set(sorted(at, key=at.get)[:2])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--target-length", "32"], "The target length 32 is inside the trained context 64"),
        (["--methods", "yarn,alibi"], "--methods 'alibi' is no training-free family a tune searches"),
        (["--target-length", "1k"], "Length 1024 is longer than every document (the longest has 300 tokens)"),
        (["--target-length", "1k", "--budget", "2"], "Length 1024 is longer than every document"),  # no screening
        (["--budget", "0"], "argument --budget: '0' is not a positive integer"),
        (["--methods", "string"], "No candidate of string takes a model trained on 64 tokens to 128"),
        (["--max-regression", "-0.1"], "--max-regression must be a finite number >= 0 (0.03: 3%)"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tiny_dir, tmp_path, capsys, extra, message):
    output = tmp_path / "out"
    argv = ["tune", "--model", str(tiny_dir / "model"), "--dataset", str(tiny_dir / "texts"), "--output", str(output)]
    if extra == ["--budget", "0"]:  # argparse's own check
        with pytest.raises(SystemExit, match="2"):
            main([*argv, *extra])
    else:
        assert main([*argv, *extra]) == 2
    lines = capsys.readouterr().err.splitlines()
    err = [line for line in lines if line.strip() and not line.startswith("Generating train split")]  # datasets' bar
    assert len(err) == 1 and message in err[0], err
    assert not output.exists()


def test_a_model_no_candidate_patches_and_an_eval_folder_are_refused_before_loading(tiny_dir, tmp_path, capsys):
    texts = ["--dataset", str(tiny_dir / "texts")]
    assert main(["tune", "--model", str(tiny_dir / "gpt2"), *texts, "--output", str(tmp_path / "out")]) == 2
    assert "No candidate of any family applies to a gpt2 model" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    (tmp_path / "results.json").write_text("{}")
    assert main(["tune", "--model", str(tiny_dir / "model"), *texts, "--output", str(tmp_path)]) == 2
    assert "holds the results.json of another run" in capsys.readouterr().err
    assert [path.name for path in tmp_path.iterdir()] == ["results.json"]
