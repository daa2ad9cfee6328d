"""The CLI turns the library's Python-speaking errors into flag advice, for every flag of every command."""

from __future__ import annotations

import pytest

from hf_posenc.cli import build_parser, flag_names, main, with_flags


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
