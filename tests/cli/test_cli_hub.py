"""``hf-posenc push`` and ``hf-posenc card`` in a fresh interpreter, against the local fake Hub."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import BASE_PPL, YARN_PPL, write_results
from hub_server import BASE_REPO, TOKEN, upload_base

import hf_posenc
from hf_posenc.cli import main

CLI = "import sys; from hf_posenc.cli import main; sys.exit(main(sys.argv[1:]))"


def run_cli(*argv: str, **env: str) -> subprocess.CompletedProcess:
    """``hf-posenc`` in a fresh interpreter, where HF_ENDPOINT is read at import as for a user."""
    environment = {**os.environ, "PYTHONPATH": str(Path(hf_posenc.__file__).parents[1]), **env}
    environment = {key: value for key, value in environment.items() if value}  # VAR="" unsets it
    return subprocess.run(
        [sys.executable, "-c", CLI, *argv], env=environment, capture_output=True, text=True, timeout=120
    )


def test_cli_push_and_card(fake_hub, tmp_path, capsys):
    """The push in a fresh interpreter, as a user runs it; the card and the refused push in this one."""
    upload_base()
    results = write_results(tmp_path, {"yarn:factor=4": YARN_PPL, "none": BASE_PPL})
    method = ["--model", BASE_REPO, "--method", "yarn:factor=4,original_max_position_embeddings=64"]
    push = [*method, "--repo", "me/cli-yarn", "--results", str(results), "--private", "--revision", "exp"]

    done = run_cli("push", *push, "--commit-message", "from the CLI")
    assert done.returncode == 0, done.stderr
    repo = fake_hub.repos["me/cli-yarn"]
    assert repo.private and repo.messages[repo.branches["exp"]] == "from the CLI"
    assert done.stdout.strip().endswith(repo.branches["exp"])  # prints the commit URL
    pushed = fake_hub.files("me/cli-yarn", "exp")
    assert json.loads(pushed["config.json"])["rope_parameters"]["rope_type"] == "yarn"
    assert not any(r.path.endswith(".safetensors") for r in fake_hub.requests)  # config-only: no weights read

    card = tmp_path / "card.md"
    code, _, err = _in_process(
        capsys, "card", *method, "--repo", "me/cli-yarn", "--revision", "exp", "--results", str(results),
        "--output", str(card),
    )  # fmt: skip
    assert code == 0, err
    assert card.read_bytes() == pushed["README.md"]  # the card renders exactly what push pushes
    assert b'hf_posenc.from_pretrained("me/cli-yarn", revision="exp")' in pushed["README.md"]  # the branch's card

    wrong = "hf_WrongCliTokenThatMustNeverBePrinted7"
    code, out, err = _in_process(capsys, "push", *push, "--token", wrong)
    assert code != 0 and "Traceback" not in err
    assert "hf-posenc push" in err and wrong not in err + out


def _in_process(capsys, *argv: str) -> tuple[int, str, str]:
    """``hf-posenc`` in this interpreter (the fake_hub fixture points huggingface_hub here): exit code, out, err."""
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_reads_a_private_base_with_the_token_and_reports_user_errors_in_one_line(
    fake_hub, tmp_path, capsys, monkeypatch
):
    """The token reaches the base's private config (in a fresh interpreter, as a user runs it); the user errors are
    each one line (in this one: the same code, without four more interpreter starts)."""
    upload_base()
    fake_hub.repos[BASE_REPO].private = True
    method = ["--model", BASE_REPO, "--method", "yarn:factor=4,original_max_position_embeddings=64"]
    card = tmp_path / "card.md"
    done = run_cli("card", *method, "--repo", "me/p", "--output", str(card), "--token", TOKEN, HF_TOKEN="")
    assert done.returncode == 0, done.stderr
    assert f"base_model: {BASE_REPO}" in card.read_text()
    results_elsewhere = write_results(tmp_path, {"yarn:factor=4": YARN_PPL}, model="org/another-model")
    cases = {
        "no token for the private base": (["card", *method], "org/tiny-base"),
        "a misspelt parameter": (["card", "--model", BASE_REPO, "--method", "yarn:fctor=4"], "'fctor'"),
        "a folder as the card's file": (["card", *method, "--token", TOKEN, "--output", str(tmp_path)], "is a folder"),
        "results of another model": (
            ["card", *method, "--token", TOKEN, "--results", str(results_elsewhere)],
            "measured on 'org/another-model', not on the base model 'org/tiny-base'",
        ),
    }
    monkeypatch.delenv("HF_TOKEN")
    for case, (argv, message) in cases.items():
        code, _, err = _in_process(capsys, *argv)
        assert code in (1, 2), (case, err)  # 1: the Hub refused, 2: bad input
        assert err.startswith("hf-posenc card:") and message in err and err.count("\n") == 1, (case, err)


def test_a_401_echoing_the_token_when_reading_the_base_is_shown_without_it(fake_hub, capsys, monkeypatch):
    """The server echoes ``Authorization: Bearer <token>`` in its 401 (an expired token, say) when the CLI first
    reads the base model (its config), with the login's token (push) and with --token (card)."""
    upload_base()
    fake_hub.fail("resolve", 401, BASE_REPO)
    method = ["--model", BASE_REPO, "--method", "yarn:factor=4,original_max_position_embeddings=64"]
    failed = run_cli("push", *method, "--repo", "me/p")  # the login's token, in a fresh interpreter
    assert failed.returncode in (1, 2) and "Traceback" not in failed.stderr, failed.stderr
    assert failed.stderr.startswith("hf-posenc push:") and "401" in failed.stderr, failed.stderr
    assert "Bearer ***" in failed.stderr  # the echo reached the message, redacted
    assert TOKEN not in failed.stderr + failed.stdout
    monkeypatch.delenv("HF_TOKEN")
    code, out, err = _in_process(capsys, "card", *method, "--token", TOKEN)  # --token, in this interpreter
    assert code in (1, 2) and err.startswith("hf-posenc card:") and "401" in err and "Bearer ***" in err, err
    assert TOKEN not in err + out
    assert all(r.authorization == f"Bearer {TOKEN}" for r in fake_hub.requests[-2:])  # it was sent, never shown
    assert "me/p" not in fake_hub.repos


def test_cli_push_with_weights_pushes_the_tokenizer_and_a_model_that_loads_patched(fake_hub, tiny_dir, capsys):
    """``--with-weights`` from a local folder: weights, tokenizer, and the config every reader reads (transformers
    5's ``rope_parameters``, 4.x's ``rope_scaling`` and ``rope_theta``); loaded back from the Hub it is the patched
    model, logit for logit, and its tokenizer encodes as the base's."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = str(tiny_dir / "model")
    code, _, err = _in_process(
        capsys, "push", "--model", folder, "--method", "yarn:factor=4", "--repo", "me/full", "--with-weights"
    )
    assert code == 0, err
    pushed = fake_hub.files("me/full")
    assert {"model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json", "README.md"} <= set(pushed)
    config = json.loads(pushed["config.json"])
    assert config["rope_parameters"]["rope_type"] == config["rope_scaling"]["type"] == "yarn"
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"]

    text = "abc def. ghi"
    local, tokenizer = AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    hf_posenc.patch(local, "yarn", factor=4)
    loaded = hf_posenc.from_pretrained("me/full").eval()
    hub_tokenizer = AutoTokenizer.from_pretrained("me/full")
    ids = tokenizer(text * 8, return_tensors="pt").input_ids  # past the 64 trained positions
    assert torch.equal(hub_tokenizer(text * 8, return_tensors="pt").input_ids, ids)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, local(ids).logits)
    assert hf_posenc.get_patch(loaded) == hf_posenc.get_patch(local)


def test_cli_push_of_a_saved_trained_t5_model_pushes_its_trained_table(fake_hub, tiny_dir, tmp_path, capsys):
    """`push --model SAVED --method t5-bias --with-weights` (its own saved method asked again): the trained table
    goes up, not the patch's start (as eval and train take it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = hf_posenc.patch(AutoModelForCausalLM.from_pretrained(tiny_dir / "model").eval(), "t5-bias")
    [table] = hf_posenc.patching.added_tensors(model).values()
    with torch.no_grad():  # "trained"
        table.add_(torch.randn(table.shape, generator=torch.Generator().manual_seed(0)))
    model.save_pretrained(tmp_path / "trained")
    AutoTokenizer.from_pretrained(tiny_dir / "model").save_pretrained(tmp_path / "trained")
    argv = ["push", "--model", str(tmp_path / "trained"), "--method", "t5-bias", "--repo", "me/t5", "--with-weights"]
    code, _, err = _in_process(capsys, *argv)
    assert code == 0, err
    ids = torch.randint(0, 97, (1, 96), generator=torch.Generator().manual_seed(1))  # past the 64 positions
    with torch.no_grad():
        assert torch.equal(hf_posenc.from_pretrained("me/t5").eval()(ids).logits, model(ids).logits)


def test_a_config_only_push_of_a_repo_holding_a_trained_t5_table_loads_that_table(fake_hub, tiny_dir, capsys):
    """`push --model REPO --method t5-bias` without the weights, REPO holding a trained table: the new repo's
    weights come from REPO at its commit, table included, so it loads the trained table, not the patch's start."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = hf_posenc.patch(AutoModelForCausalLM.from_pretrained(tiny_dir / "model").eval(), "t5-bias")
    [table] = hf_posenc.patching.added_tensors(model).values()
    with torch.no_grad():  # "trained"
        table.add_(torch.randn(table.shape, generator=torch.Generator().manual_seed(0)))
    hf_posenc.push_to_hub(
        model, "me/t5-trained", with_weights=True, tokenizer=AutoTokenizer.from_pretrained(tiny_dir / "model")
    )
    assert (
        b"| llama.cpp | refused | its converter has no GGUF name"
        in fake_hub.files("me/t5-trained", "main")["README.md"]
    )
    code, _, err = _in_process(
        capsys, "push", "--model", "me/t5-trained", "--method", "t5-bias", "--repo", "me/t5-config-only"
    )
    assert code == 0, err
    assert not any(name.endswith(".safetensors") for name in fake_hub.files("me/t5-config-only", "main"))
    ids = torch.randint(0, 97, (1, 96), generator=torch.Generator().manual_seed(1))  # past the 64 positions
    with torch.no_grad():
        assert torch.equal(hf_posenc.from_pretrained("me/t5-config-only").eval()(ids).logits, model(ids).logits)


def test_cli_push_with_weights_compares_the_fingerprint_eval_recorded(fake_hub, tiny_dir, tmp_path, capsys):
    """``push --with-weights`` takes the fingerprint of the folder's weights as ``eval`` does: the results of that
    eval go up with them; results of weights retrained since (another fingerprint) are refused, nothing pushed."""
    folder, output = str(tiny_dir / "model"), tmp_path / "run"
    evaluate = ["eval", "--model", folder, "--dataset", str(tiny_dir / "texts"), "--output", str(output)]
    code, _, err = _in_process(capsys, *evaluate, "--method", "none", "--method", "yarn:factor=4", "--lengths", "32")
    assert code == 0, err
    push = ["push", "--model", folder, "--method", "yarn:factor=4", "--with-weights"]
    code, _, err = _in_process(capsys, *push, "--results", str(output / "results.json"), "--repo", "me/same")
    assert code == 0, err
    assert "eval_results.json" in fake_hub.files("me/same")
    report = json.loads((output / "results.json").read_text())
    report["model_details"]["fingerprint"] = "0" * 16
    (tmp_path / "retrained.json").write_text(json.dumps(report))
    code, _, err = _in_process(capsys, *push, "--results", str(tmp_path / "retrained.json"), "--repo", "me/other")
    assert code == 2 and "were measured on other weights than those pushed" in err, err
    assert "me/other" not in fake_hub.repos


def test_cli_push_with_weights_of_a_folder_without_a_tokenizer_is_one_clear_error(fake_hub, tmp_path, capsys):
    """Not transformers' advice to install sentencepiece or tiktoken: the folder, and what it lacks; nothing pushed."""
    from tiny_models import make_tiny

    folder = tmp_path / "no-tokenizer"
    make_tiny("llama").save_pretrained(folder)
    push = ["push", "--model", str(folder), "--method", "yarn:factor=4", "--repo", "me/x", "--with-weights"]
    code, _, err = _in_process(capsys, *push)
    assert code == 2 and err.count("\n") == 1, err  # one line: the weights were not even loaded
    assert f"--with-weights pushes the tokenizer with the weights, and the folder {folder} holds none" in err
    assert "tokenizer_config.json, tokenizer.json" in err and "sentencepiece or tiktoken installed" not in err
    assert "me/x" not in fake_hub.repos


def test_cli_push_with_weights_of_a_hub_repo_without_a_tokenizer_is_one_clear_error(fake_hub, capsys):
    """The same for a base on the Hub whose repo holds no tokenizer: its files say so before any weight loads."""
    from hub_server import BASE_REPO, upload_base

    upload_base()
    push = ["push", "--model", BASE_REPO, "--method", "yarn:factor=4", "--repo", "me/x", "--with-weights"]
    code, _, err = _in_process(capsys, *push)
    assert code == 2 and err.count("\n") == 1, err
    assert f"--with-weights pushes the tokenizer with the weights, and the repo {BASE_REPO!r} holds none" in err
    assert "sentencepiece or tiktoken installed" not in err and "me/x" not in fake_hub.repos
