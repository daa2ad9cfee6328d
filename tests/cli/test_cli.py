"""The CLI turns the library's Python-speaking errors into flag advice, for every flag of every command."""

from __future__ import annotations

import pytest

from hf_posenc.cli import build_parser, flag_names, main, with_flags
from hf_posenc.cli import eval as eval_cli
from hf_posenc.cli import hub as hub_cli


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


def _interrupted(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("module", "runner", "argv", "said"),
    [
        (eval_cli, "run_perplexity", ["eval", "--model", "org/m", "--dataset", "texts", "--output", "{output}"], "results are kept in {output}; rerun the same command to resume"),
        (eval_cli, "run_passkey", ["passkey", "--model", "org/m", "--output", "{output}"], "results are kept in {output}; rerun the same command to resume"),
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
