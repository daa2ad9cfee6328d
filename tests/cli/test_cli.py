"""The CLI turns the library's Python-speaking errors into flag advice, for every flag of every command."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from hf_posenc import _startup
from hf_posenc.cli import build_parser, flag_names, main, with_flags
from hf_posenc.cli import share as hub_cli
from hf_posenc.eval import runner


@pytest.fixture(autouse=True)
def hub_offline(monkeypatch):
    """The commands here name models no Hub holds (``org/m``): offline, they do not ask the network first (nor note
    that it cannot be reached), whatever the machine can reach."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def commands():
    parser = build_parser()
    return {name: parser.parse_args([name, *extra]) for name, extra in {
        "eval": [], "passkey": [], "push": ["--model", "m", "--method", "yarn", "--repo", "r"], "card": ["--model", "m", "--method", "yarn"],
    }.items()}  # fmt: skip


def test_every_option_is_reachable_by_its_python_name(commands):
    assert commands["eval"].flags["text_column"] == "--text-column"
    assert commands["eval"].flags["methods"] == "--method"  # run_perplexity(methods=...) is --method
    assert commands["eval"].flags["config"] == "--dataset-config"  # TextSource(config=...)
    assert commands["push"].flags["with_weights"] == "--with-weights"
    assert commands["push"].flags["base_model"] == "--model"  # push_to_hub(base_model=...)
    assert commands["card"].flags["eval_results"] == "--results"
    assert "batch_size" not in commands["passkey"].flags  # passkey has no --batch-size


def test_backticked_parameters_become_flags_and_nothing_else_changes(commands):
    flags = commands["eval"].flags
    message = "`stride` applies to `protocol` sliding; log in with `hf auth login`, or `nonexistent`; 'factor=4'."
    assert with_flags(message, flags) == (
        "--stride applies to --protocol sliding; log in with `hf auth login`, or `nonexistent`; 'factor=4'."
    )
    assert flag_names(build_parser()) == {"help": "--help"}  # the top-level parser: no options but -h


def test_a_library_error_reaches_the_user_with_its_flag(tmp_path, capsys):
    (tmp_path / "README.md").mkdir()
    assert main(["card", "--model", "org/m", "--method", "none", "--output", str(tmp_path / "README.md")]) == 2
    assert f"error: --output {tmp_path / 'README.md'} is a folder" in capsys.readouterr().err
    assert main(["card", "--model", "org/m", "--method", "none"]) == 2
    assert (
        "error: --method 'none' is the unpatched model: there is no patch to push or describe"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize("flag", ["--results", "--lm-eval-results"])
def test_a_card_output_naming_a_results_file_it_reads_is_refused_before_anything(tmp_path, capsys, flag):
    """`card --results results.json --output results.json` would replace the results with the card."""
    results = tmp_path / "results.json"
    results.write_text('{"mine": 1}')
    argv = [
        "card",
        "--model",
        "org/m",
        "--method",
        "yarn",
        flag,
        str(results),
        "--output",
        f"{tmp_path}/./results.json",
    ]
    assert main(argv) == 2
    assert f"error: --output {tmp_path}/results.json is a results file the card reads" in capsys.readouterr().err
    assert results.read_text() == '{"mine": 1}'


def _interrupted(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("module", "runner", "argv", "said"),
    [
        (runner, "run_perplexity", ["eval", "--model", "org/m", "--dataset", "texts", "--output", "{output}"], "results are kept in {output}; rerun the same command to resume"),
        (runner, "run_passkey", ["passkey", "--model", "org/m", "--output", "{output}"], "results are kept in {output}; rerun the same command to resume"),
        (hub_cli, "run_push", ["push", "--model", "org/m", "--method", "yarn", "--repo", "me/r"], "a push is one commit, so the repo holds all of it or none of it"),
        (hub_cli, "run_card", ["card", "--model", "org/m", "--method", "yarn", "--output", "{output}"], "interrupted."),
    ],
)  # fmt: skip
def test_ctrl_c_exits_130_with_one_line(monkeypatch, capsys, tmp_path, module, runner, argv, said):
    """Ctrl-C in the middle of a command (its runner raises KeyboardInterrupt): no traceback, one line saying
    what is kept; eval and passkey name their output folder."""
    monkeypatch.setattr(module, runner, _interrupted)
    assert main([arg.format(output=tmp_path / "run") for arg in argv]) == 130
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith(f"hf-posenc {argv[0]}: interrupted")
    assert said.format(output=tmp_path / "run") in captured.err


def test_every_message_printed_is_redacted(monkeypatch, capsys):
    """Whatever an error says, main shows neither --token, nor the login's token, nor anything token-shaped."""
    monkeypatch.setenv("HF_TOKEN", "saved-login-token-42")
    secrets = ["given-token-7", "saved-login-token-42", "Bearer echoed.value", "hf_" + "a1" * 8]

    def leaky(args):
        raise OSError(f"the server said: {', '.join(secrets)}")

    monkeypatch.setattr(hub_cli, "run_card", leaky)
    assert main(["card", "--model", "org/m", "--method", "yarn", "--token", "given-token-7"]) == 2
    err = capsys.readouterr().err
    assert err == "hf-posenc card: error: the server said: ***, ***, Bearer ***, ***\n"


# Ctrl-C at the moment a module is imported (where a real one usually lands: seconds of imports), for every
# program the interpreter runs: a sitecustomize on the path.
_INTERRUPTING_IMPORT = """
import builtins
real_import = builtins.__import__
def interrupting(name, *args, **kwargs):
    if name == {name!r}:
        raise KeyboardInterrupt
    return real_import(name, *args, **kwargs)
builtins.__import__ = interrupting
"""


def _interrupted_run(tmp_path, monkeypatch, at: str, *command: str) -> subprocess.CompletedProcess:
    (tmp_path / "sitecustomize.py").write_text(_INTERRUPTING_IMPORT.format(name=at))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    return subprocess.run([sys.executable, *command], capture_output=True, text=True, cwd=tmp_path)


@pytest.mark.parametrize(
    ("at", "command"),
    [
        ("transformers", ["-m", "hf_posenc", "eval"]),  # the library, once the arguments are parsed
        ("training.settings", ["-m", "hf_posenc", "eval", "--help"]),  # the commands' modules, in main()
        (
            "transformers",
            ["-c", "import sys; sys.argv[0] = '/x/hf-posenc'; from hf_posenc.cli import main; main(['eval'])"],
        ),
    ],
)
def test_ctrl_c_while_the_command_starts_is_one_line_and_130(tmp_path, monkeypatch, at, command):
    done = _interrupted_run(tmp_path, monkeypatch, at, *command)
    assert (done.returncode, done.stderr) == (130, f"hf-posenc: {_startup.STARTING}\n")


_HEAVY = ("torch", "transformers", "accelerate", "datasets", "matplotlib")


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["eval", "--help"], ["passkey", "--help"], ["train", "--help"], ["push", "--help"],
     ["card", "--help"], ["plot", "--help"], ["check", "--help"], ["evl"], ["eval", "--lenghts", "4k"],
     ["train", "--method", "alibi"]],
)  # fmt: skip
def test_help_and_a_mistyped_command_answer_without_importing_torch(argv):
    """The command's parser imports nothing heavy: ``--help`` and a usage error answer at once (issue: under 1 s on
    2 cores, scripts/bench_cli_help.py), and the library loads only for a command that runs."""
    code = (
        "import sys; sys.argv[0] = '/venv/bin/hf-posenc'\n"
        "from hf_posenc.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as exit_:\n    code = exit_.code\n"
        f"print(code, [name for name in {_HEAVY!r} if name in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == f"{0 if '--help' in argv else 2} []", done.stdout[-500:] + done.stderr


def test_a_program_importing_hf_posenc_keeps_its_keyboard_interrupt(tmp_path, monkeypatch):
    (tmp_path / "myproject").mkdir()
    (tmp_path / "myproject" / "__init__.py").write_text("import hf_posenc\n")
    (tmp_path / "myproject" / "__main__.py").write_text("")
    done = _interrupted_run(tmp_path, monkeypatch, "transformers", "-m", "myproject")
    assert done.returncode != 0 and "Traceback" in done.stderr and done.stderr.rstrip().endswith("KeyboardInterrupt")


@pytest.mark.parametrize(
    ("argv", "line", "command"),
    [
        (["/venv/bin/hf-posenc"], ["/venv/bin/python", "/venv/bin/hf-posenc", "eval"], True),
        (["C:\\venv\\Scripts\\HF-POSENC.EXE"], ["python.exe", "hf-posenc.exe"], True),
        (["-m"], ["python", "-m", "hf_posenc", "eval"], True),  # while the package imports
        (["/x/hf_posenc/__main__.py"], ["python", "-X", "importtime", "-m", "hf_posenc"], True),  # then
        (["/x/hf_posenc/__main__.py"], ["python", "-mhf_posenc"], True),
        (["-m"], ["python", "-m", "myproject.train"], False),  # a package that imports hf_posenc
        (["train.py"], ["python", "train.py", "-m", "hf_posenc"], False),  # an argument of a script
        (["pytest"], ["python", "-m", "pytest"], False),
        ([], [], False),
    ],
)
def test_the_command_is_told_apart_by_the_interpreters_command_line(monkeypatch, argv, line, command):
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(sys, "orig_argv", line)
    assert _startup.is_command() is command


@pytest.mark.parametrize(
    "argv",
    [
        ["eval", "--model", "{missing}", "--output", "{output}"],
        ["passkey", "--model", "{missing}", "--output", "{output}"],
        ["card", "--model", "{missing}", "--method", "yarn:factor=4", "--output", "{output}/README.md"],
        ["push", "--model", "{missing}", "--method", "yarn:factor=4", "--repo", "me/r"],
        ["check", "{missing}"],
    ],
)
def test_a_model_path_to_nothing_is_one_line_and_writes_nothing(tmp_path, capsys, argv):
    """Not the Hub's answer about repo ids: the path named, nothing written."""
    missing, output = tmp_path / "models" / "absent", tmp_path / "run"
    assert main([arg.format(missing=missing, output=output) for arg in argv]) == 2
    err = capsys.readouterr().err
    assert err == f"hf-posenc {argv[0]}: error: {str(missing)!r}: no such file or folder (a path, not a Hub id)\n"
    assert not output.exists()


def test_a_message_over_several_lines_is_printed_on_one(monkeypatch, capsys, tmp_path):
    def failing(*args, **kwargs):
        raise OSError("We couldn't connect.\n  Check your connection.\n")

    monkeypatch.setattr(runner, "run_perplexity", failing)
    assert main(["eval", "--model", "org/m", "--dataset", "texts", "--output", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == "hf-posenc eval: error: We couldn't connect. Check your connection.\n"


def test_train_help_is_each_settings_own_help():
    """``hf-posenc train --help`` shows every setting with the help written once, on its field."""
    import dataclasses

    from hf_posenc.fields import field_help
    from hf_posenc.training.settings import TrainSettings

    parser = build_parser()
    [choices] = [action.choices for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    train = choices["train"]
    by_dest = {action.dest: action for action in train._actions}
    helps = field_help(TrainSettings)
    assert set(helps) == {item.name for item in dataclasses.fields(TrainSettings)}
    for name, text in helps.items():
        assert by_dest[name].help.replace("%%", "%").startswith(text), name
    assert "trainable (`str`, defaults to `'all'`): all; position:" in " ".join(TrainSettings.__doc__.split())
