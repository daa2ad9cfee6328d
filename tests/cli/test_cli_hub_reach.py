"""The commands that load a Hub model (eval, passkey, lm-eval, push, card) where the Hub cannot be reached, as
``check`` (tests/cli/test_cli_check.py): a model not in the cache fails at once (no retries), in one line naming it,
its revision and the reason (HF_HUB_OFFLINE set; no connection), and nothing is written; a cached model loads offline,
to the same numbers."""

from __future__ import annotations

import importlib.util
import logging
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from hub_server import BASE_REPO, TOKEN, upload_base
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
from tiny_runs import folder_files, results_of

from hf_posenc.cli import main

CLOSED = "http://127.0.0.1:1"  # nothing listens there: every connection is refused at once
NO_LM_EVAL = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm_eval is not installed")
COMMANDS = {  # each command's arguments but the model: a run that would write into {output}
    "eval": ["eval", "--dataset", "{texts}", "--output", "{output}", "--method", "none", "--lengths", "8"],
    "passkey": ["passkey", "--output", "{output}", "--method", "none", "--lengths", "400"],
    "lm-eval": ["lm-eval", "--tasks", "tiny_choice", "--method", "none", "--output", "{output}"],
    "push": ["push", "--method", "yarn:factor=4", "--repo", "me/pushed"],
    "card": ["card", "--method", "yarn:factor=4", "--output", "{output}/README.md"],
}
REVISION_FLAG = {"push": "--model-revision", "card": "--model-revision"}


@pytest.fixture
def retries(monkeypatch) -> list[float]:
    """The waits of huggingface_hub's retries (recorded, not slept)."""
    from huggingface_hub.utils import _http

    waits: list[float] = []
    monkeypatch.setattr(_http, "time", SimpleNamespace(sleep=waits.append))
    return waits


@pytest.fixture(params=["offline", "no connection"])
def unreachable(request, fake_hub, monkeypatch) -> str:
    """The Hub out of reach: HF_HUB_OFFLINE set, or its downloads refused (the fake Hub's API still answers); the
    reason the message gives."""
    if request.param == "offline":
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        return "(HF_HUB_OFFLINE is set)"
    template = constants.HUGGINGFACE_CO_URL_TEMPLATE.replace(fake_hub.endpoint, CLOSED)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    return "(ConnectError: "


def _argv(command: str, model: str, output, revision: str | None = None) -> list[str]:
    argv = [arg.format(output=output, texts=output.parent / "texts") for arg in COMMANDS[command]]
    return [*argv, "--model", model, *([REVISION_FLAG.get(command, "--revision"), revision] if revision else [])]


def _one_line_error(capsys, command: str) -> str:
    """The error: one line, after the library's notes (``hf_posenc: ...``, the command shows them on stderr too)."""
    *notes, error = capsys.readouterr().err.splitlines()
    assert error.startswith(f"hf-posenc {command}: error: ") and all(n.startswith("hf_posenc: ") for n in notes), notes
    return error.removeprefix(f"hf-posenc {command}: error: ")


@pytest.mark.parametrize("command", ["eval", "passkey", pytest.param("lm-eval", marks=NO_LM_EVAL), "push", "card"])
def test_a_model_not_cached_fails_at_once_naming_it_and_the_reason(
    command, unreachable, fake_hub, retries, tmp_path, capsys
):
    """No connection can be made: the run fails at once naming the model and the reason, not with transformers'
    "We couldn't connect to ..." (no model named, nor HF_HUB_OFFLINE) after huggingface_hub's five retries (~25 s)."""
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("some text to score")
    output = tmp_path / "out"
    output.mkdir()
    for name in ("results.json", "passkey.json", "lm_eval.json", "README.md"):  # an earlier run's files
        (output / name).write_text('{"mine": 1}')
    before = folder_files(output)
    assert main(_argv(command, "me/never-read", output, revision="v1")) == 2
    message = _one_line_error(capsys, command)
    assert message.startswith(
        f"--model 'me/never-read' at revision 'v1' cannot be loaded: the Hub cannot be reached {unreachable}"
    )
    assert message.endswith("and its config.json is not in the cache."), message
    assert retries == [] and folder_files(output) == before and "me/pushed" not in fake_hub.repos


def test_a_gguf_file_not_cached_is_named(fake_hub, tmp_path, monkeypatch, capsys):
    """A GGUF file of a Hub repo is what loading reads there (it has no config.json): the file is looked for."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    (tmp_path / "texts").mkdir()
    assert main([*_argv("eval", "me/quantized", tmp_path / "out"), "--gguf-file", "m.Q4_1.gguf"]) == 2
    assert _one_line_error(capsys, "eval").endswith("is set), and its m.Q4_1.gguf is not in the cache.")


def _upload_tiny(tiny_dir) -> str:
    """The tiny model on the fake Hub as ``me/tiny``; its id."""
    HfApi(token=TOKEN).create_repo("me/tiny")
    HfApi(token=TOKEN).upload_folder(repo_id="me/tiny", folder_path=tiny_dir / "model")
    return "me/tiny"


@pytest.fixture
def evaluated_online(fake_hub, tiny_dir, tmp_path) -> tuple[list[str], Path]:
    """``me/tiny`` evaluated once online (so in the cache): the eval's arguments but ``--output``, and its output."""
    run = ["eval", "--model", _upload_tiny(tiny_dir), "--dataset", str(tiny_dir / "texts"), "--method", "none"]
    run += ["--lengths", "32"]
    assert main([*run, "--output", str(tmp_path / "online")]) == 0
    return run, tmp_path / "online"


def test_a_cached_model_is_evaluated_offline_as_before(evaluated_online, tmp_path, monkeypatch, capsys):
    """A model read once is in the cache: eval reads it there offline, the same commit to the same numbers."""
    run, online = evaluated_online
    offline = tmp_path / "offline"
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert main([*run, "--output", str(offline)]) == 0
    assert [row["ppl"] for row in results_of(offline)["results"]] == [
        row["ppl"] for row in results_of(online)["results"]
    ]
    assert results_of(offline)["model_details"]["commit"] == results_of(online)["model_details"]["commit"]


def test_a_config_only_push_whose_base_is_not_cached_names_the_base(fake_hub, tmp_path, monkeypatch, capsys):
    """The pushed repo is in the cache, the base it takes its weights from is not: the base's id and commit are
    named, before anything is loaded."""
    commit = upload_base()
    assert main(["push", "--model", BASE_REPO, "--method", "yarn:factor=4", "--repo", "me/config-only"]) == 0
    shutil.rmtree(constants.HF_HUB_CACHE)
    snapshot_download("me/config-only")  # its config and hf_posenc.json only
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    capsys.readouterr()
    (tmp_path / "texts").mkdir()
    output = tmp_path / "out"
    assert main(_argv("eval", "me/config-only", output)) == 2
    assert _one_line_error(capsys, "eval") == (
        f"--model 'me/config-only' is a config-only push; its base model {BASE_REPO!r} at revision {commit!r} cannot "
        "be loaded: the Hub cannot be reached (HF_HUB_OFFLINE is set), and its config.json is not in the cache."
    )
    assert not output.exists()


@pytest.fixture
def config_alone_cached(fake_hub, tiny_dir) -> str:
    """A model on the Hub of which the cache holds config.json alone (as ``check`` leaves it), read before the Hub
    goes out of reach (it comes first among a test's fixtures); its id."""
    hf_hub_download(_upload_tiny(tiny_dir), "config.json")
    return "me/tiny"


@pytest.mark.parametrize("command", ["eval", "passkey"])
def test_a_model_whose_config_alone_is_cached_fails_at_once_naming_its_weights(
    command, config_alone_cached, unreachable, retries, tmp_path, capsys
):
    """``check`` and a config-only push read a model's config.json alone: with only that in the cache, a command that
    loads the weights names them (not the tokenizer's sentencepiece advice, after 5 retries of each file where no
    connection can be made)."""
    (tmp_path / "texts").mkdir()
    output = tmp_path / "out"
    assert main(_argv(command, config_alone_cached, output)) == 2
    message = _one_line_error(capsys, command)
    assert message.startswith(f"--model 'me/tiny' cannot be loaded: the Hub cannot be reached {unreachable}")
    assert message.endswith("and its weights are (model.safetensors, model.safetensors.index.json, pytorch_model.bin, "
                            "pytorch_model.bin.index.json; only its config.json is there) not in the cache.")  # fmt: skip
    assert retries == [] and not output.exists()


def test_with_no_connection_a_cached_model_loads_at_once_and_offline_mode_is_restored(
    evaluated_online, fake_hub, tmp_path, monkeypatch, retries, caplog
):
    """No connection and HF_HUB_OFFLINE not set: the run reads the cache alone, as HF_HUB_OFFLINE=1 would (not after
    huggingface_hub's five retries of a download, ~25 s), to the same numbers, with a warning; the
    process is online again after it."""
    run, online = evaluated_online
    cut_off = tmp_path / "cut-off"
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    template = constants.HUGGINGFACE_CO_URL_TEMPLATE.replace(fake_hub.endpoint, CLOSED)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    with caplog.at_level(logging.WARNING, logger="hf_posenc"):
        assert main([*run, "--output", str(cut_off)]) == 0
    assert retries == [] and constants.HF_HUB_OFFLINE is False
    assert (
        "the Hub cannot be reached (ConnectError: " in caplog.text
        and "reads huggingface_hub's cache alone" in caplog.text
    )
    assert [row["ppl"] for row in results_of(cut_off)["results"]] == [
        row["ppl"] for row in results_of(online)["results"]
    ]


@pytest.mark.parametrize(
    ("error", "unreachable"),
    [("ConnectError", True), ("ConnectTimeout", True), ("ProxyError", True), ("ReadTimeout", False)],
)
def test_a_connection_that_cannot_be_made_is_unreachable_and_one_made_is_not(monkeypatch, error, unreachable):
    """A connection refused, timed out before it was made (a firewall dropping packets) or refused by the proxy
    means no connection can be made: the run says so at once, without huggingface_hub's retries. A connection made
    that waits for its answer is the download's to handle."""
    import httpx2

    from hf_posenc.hub import reach as hub_reach

    def head(*args, **kwargs):
        raise getattr(httpx2, error)("the network said no")

    monkeypatch.setattr(hub_reach, "get_hf_file_metadata", head)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    reason = hub_reach.hub_unreachable("me/model")
    assert reason == (f"{error}: the network said no" if unreachable else None)


@pytest.mark.parametrize("offline", [False, True])
def test_a_hub_dataset_not_cached_fails_at_once_with_no_connection(
    tiny_dir, tmp_path, monkeypatch, retries, capsys, offline
):
    """A Hub ``--dataset`` with no connection (HF_HUB_OFFLINE unset) is read from the datasets cache alone, as a
    model is (not after huggingface_hub's five retries, with advice to give a Hub dataset id); one not there is one
    line naming the reason, nothing is written, and datasets is online again after it. With HF_HUB_OFFLINE set the
    line names that."""
    import datasets.config

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", CLOSED)
    monkeypatch.setattr(constants, "ENDPOINT", CLOSED)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", CLOSED + "/{repo_id}/resolve/{revision}/{filename}")
    output = tmp_path / "out"
    argv = ["eval", "--model", str(tiny_dir / "model"), "--dataset", "someone/texts", "--output", str(output)]
    assert main([*argv, "--method", "none", "--lengths", "8"]) == 2
    line = _one_line_error(capsys, "eval")
    reason = "HF_HUB_OFFLINE is set" if offline else "ConnectError: "
    assert "Cannot load dataset 'someone/texts'" in line and f"The Hub cannot be reached ({reason}" in line
    assert "only the datasets cache was read" in line and ".." not in line
    assert retries == [] and not output.exists()
    assert datasets.config.HF_HUB_OFFLINE is offline and constants.HF_HUB_OFFLINE is offline


def test_datasets_first_imported_while_the_cache_is_read_alone_is_online_after():
    """`datasets` reads offline mode once, when imported: imported inside a run's cache-only block (the CLI imports
    it only to read a dataset), it stayed offline for the rest of the process."""
    import os
    import subprocess
    import sys

    script = (
        "import sys; from hf_posenc.hub.reach import cache_only_if_unreachable\n"
        "with cache_only_if_unreachable('someone/model'):\n"
        "    import datasets.config; inside = datasets.config.HF_HUB_OFFLINE\n"
        "print(inside, datasets.config.HF_HUB_OFFLINE, 'datasets' in sys.modules)\n"
    )
    env = {key: value for key, value in os.environ.items() if key not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    done = subprocess.run(
        [sys.executable, "-c", script], env={**env, "HF_ENDPOINT": CLOSED}, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["True", "False", "True"]
