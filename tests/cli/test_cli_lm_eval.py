"""``hf-posenc lm-eval`` on the tiny model saved to disk and two local tasks: lm-eval's own options passed through,
the results file and table written, and bad input refused in one line."""

from __future__ import annotations

import json
import sys

import pytest
from lm_eval_tasks import write_tasks

from hf_posenc.cli import main

pytest.importorskip("lm_eval")


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> str:
    return str(write_tasks(tmp_path_factory.mktemp("tasks")))


def test_lm_eval_writes_the_results_and_prints_the_table(tiny_dir, tasks, tmp_path, capsys, one_thread):
    """The results and the table; a token in --model_args (lm-eval hands model_args on to its model, and to
    from_pretrained) is redacted in lm_eval.json, which a push uploads as it is."""
    output = tmp_path / "out"
    secret = "hf_SecretTokenValue1234567890"
    argv = ["lm-eval", "--model", str(tiny_dir / "model"), "--method", "none", "--method", "yarn:factor=4"]
    argv += ["--include_path", tasks, "--tasks", "tiny_choice", "--limit", "4", "--metadata", "note=x"]
    argv += ["--model_args", f"token={secret}"]
    assert main([*argv, "--output", str(output)]) == 0
    text = (output / "lm_eval.json").read_text()
    captured = capsys.readouterr()
    assert secret not in text and secret not in captured.err + captured.out
    report = json.loads(text)
    assert report["arguments"]["model_args"] == {"token": "***"}
    assert [run["method"] for run in report["runs"]] == ["none", "yarn:factor=4"]
    assert report["arguments"]["limit"] == 4 and report["arguments"]["include_path"] == tasks
    assert report["arguments"]["metadata"] == {"note": "x", "pretrained": str(tiny_dir / "model"), "token": "***"}
    assert all(run["n-samples"]["tiny_choice"]["effective"] == 4 for run in report["runs"])  # --limit applied
    printed = captured.out
    scores = [f"{run['results']['tiny_choice']['acc,none']:.4f}" for run in report["runs"]]
    assert f"lm-eval {report['lm_eval_version']}, max_length 256:" in printed
    assert ["tiny_choice", "acc,none", *scores] in [line.split() for line in printed.splitlines()]
    assert f"Results: {output}/lm_eval.json" in printed
    written = (output / "lm_eval.json").read_bytes()  # a rerun does not resume: it refuses, the scores kept
    assert main([*argv, "--output", str(output)]) == 2
    assert "holds the lm_eval.json of an earlier run" in _one_line_error(capsys)
    assert (output / "lm_eval.json").read_bytes() == written


def _one_line_error(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("hf-posenc lm-eval: error: "), err
    return err[0]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--tasks", "tiny_choice", "--output_path", "x"], "--output_path does not apply to hf-posenc lm-eval"),
        (["--tasks", "tiny_choice", "--trust_remote_code"], "never runs code"),
        (["--tasks", "tiny_choice", "--model_args", "pretrained=gpt2"], "--model names the model"),
        (["--tasks", "tiny_choice", "--model_args", "revision=abc"], "the model hf_posenc hands it: give --revision."),
        (["--tasks", "tiny_choice", "--model_args", "parallelize=True"], "give --device-map (and --max-memory)"),
        (["--tasks", "tiny_choice", "--revision", "main"], "--revision names a commit of a Hub repo, and --model"),
        (["--tasks", "tiny_choice", "--max-memory", "0=1GiB"], "--max-memory budgets the devices a --device-map"),
        (["--tasks", "no_such_task"], "Tasks not found: no_such_task"),
        (["--tasks", ""], "--tasks names an empty task (''); give task names."),
        (["--tasks", "tiny_choice", "--limit", "-3"], "--limit must be a finite number > 0 (examples per task, or"),
        (["--tasks", "tiny_choice", "--limit", "inf"], "--limit must be a finite number > 0"),
        (["--tasks", "tiny_choice", "--model_args", "max_length=abc"], "--model_args max_length=N must be a whole"),
        (["--tasks", "tiny_choice", "--model_args", "max_length=-5"], "max_length=N must be a whole number of tokens"),
        (["--tasks", "tiny_choice", "--model_args", f"max_length={2**40}"], "from 1 to 16777216, got 1099511627776"),
        (["--tasks", "tiny_choice", "--num_fewshot", "-1"], "--num_fewshot must be a whole number from 0 to 10000"),
        (["--tasks", "tiny_choice", "--num_fewshot", "100000"], "--num_fewshot must be a whole number from 0"),
        (["--tasks", "tiny_choice", "--confirm_run_unsafe_code"], "never runs code from a task, model or dataset"),
        (["--tasks", "tiny_choice", "--show_config"], "--show_config does not apply to hf-posenc lm-eval"),
        (
            ["--tasks", "tiny_choice", "--batch_size", "0"],
            "--batch_size must be a positive integer, 'auto' or 'auto:N'",
        ),
        (["--tasks", "tiny_choice", "--batch_size", "auto:0"], "--batch_size must be a positive integer"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tiny_dir, tasks, tmp_path, capsys, extra, message):
    argv = ["lm-eval", "--model", str(tiny_dir / "model"), "--include_path", tasks, "--output", str(tmp_path), *extra]
    assert main(argv) == 2
    assert message in _one_line_error(capsys)
    assert not (tmp_path / "lm_eval.json").exists()


def test_its_help_offers_only_the_options_that_work(capsys):
    """lm-eval's options that hf-posenc refuses (``--output_path``: results go to ``--output``) are not offered in the
    list of options; the epilog names them as refused."""
    from hf_posenc.cli.lm_eval import REFUSED

    with pytest.raises(SystemExit):
        main(["lm-eval", "--help"])
    out = capsys.readouterr().out
    options = out.split("examples:")[0].split("Every lm-eval run option above")[0]
    assert "--num_fewshot" in options and "--output " in options
    assert not [option for option in REFUSED if f"--{option}" in options]


def test_the_library_bounds_what_it_passes_to_lm_eval(tiny_dir, tasks):
    """``run_lm_eval`` refuses, before loading the model, what the command refuses."""
    from hf_posenc.eval import LmEvalConfig

    for kwargs, message in [
        ({"max_length": 0}, "`max_length` must be a whole number"),
        ({"max_length": True}, "`max_length` must be a whole number"),
        ({"evaluate": {"num_fewshot": -1}}, "`num_fewshot` must be a whole number"),
        ({"evaluate": {"confirm_run_unsafe_code": True}}, "`confirm_run_unsafe_code` does not apply"),
    ]:
        with pytest.raises(ValueError, match=message):
            LmEvalConfig(["tiny_choice"], include_path=tasks, **kwargs)


def test_an_output_holding_a_run_is_named_by_its_flag(tiny_dir, tasks, tmp_path, capsys):
    (tmp_path / "lm_eval.json").write_text("{}")
    argv = ["lm-eval", "--model", str(tiny_dir / "model"), "--include_path", tasks, "--tasks", "tiny_choice"]
    assert main([*argv, "--output", str(tmp_path)]) == 2
    assert _one_line_error(capsys).startswith(f"hf-posenc lm-eval: error: --output {tmp_path} holds the lm_eval.json")
    assert (tmp_path / "lm_eval.json").read_text() == "{}"


def test_without_lm_eval_it_says_what_to_install(monkeypatch, tiny_dir, capsys):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval raises ImportError
    assert main(["lm-eval", "--model", str(tiny_dir / "model"), "--tasks", "tiny_choice"]) == 2
    assert "install it with: pip install 'hf-posenc[lm-eval]'" in _one_line_error(capsys)


def test_without_lm_eval_its_help_says_what_the_command_is_and_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    assert main(["lm-eval", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: hf-posenc lm-eval --tasks") and "pip install 'hf-posenc[lm-eval]'" in out


def test_an_output_it_cannot_write_is_refused_before_any_task_runs(tiny_dir, tasks, tmp_path, capsys, monkeypatch):
    """A read-only place (root passes permission bits, so it is simulated) is found before the tasks run (not
    after every method was evaluated, as the bare "[Errno 30] Read-only file system")."""
    import tempfile

    from hf_posenc.eval import harness as lm_eval

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    monkeypatch.setattr(lm_eval, "_load", lambda *a, **k: pytest.fail("the model was loaded"))
    argv = ["lm-eval", "--model", str(tiny_dir / "model"), "--include_path", tasks, "--tasks", "tiny_choice"]
    assert main([*argv, "--output", str(tmp_path / "out")]) == 2
    said = f"Cannot write results to {tmp_path / 'out'} (cannot create a folder in {tmp_path}): Read-only file system"
    assert said in _one_line_error(capsys)
