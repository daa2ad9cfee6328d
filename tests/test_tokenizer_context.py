"""The tokenizer saved beside a patched model says its context (``model_max_length``, which vLLM takes as a cap), and
``check`` flags a tokenizer that caps it: pushes with weights, trained models, and a saved folder or Hub repo."""

from __future__ import annotations

import json

import pytest
from conftest import make_tiny
from hub_server import BASE_REPO, TOKEN, upload_base
from huggingface_hub import HfApi
from tokenizers import Tokenizer, models
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

import hf_posenc
from hf_posenc import hub
from hf_posenc.cli import main
from hf_posenc.serving import tokenizer_findings
from hf_posenc.tokenizer_context import follow_context, raised_model_max_length
from hf_posenc.training import TrainSettings, pack_windows, train

SENTINEL = int(1e30)  # transformers' VERY_LARGE_INTEGER: a tokenizer without a limit


def tokenizer(model_max_length: int) -> PreTrainedTokenizerFast:
    vocab = {"<unk>": 0, "<s>": 1, **{chr(c): i + 2 for i, c in enumerate(range(97, 123))}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", model_max_length=model_max_length)


def saved_length(folder) -> int:
    return json.loads((folder / "tokenizer_config.json").read_text())["model_max_length"]


@pytest.mark.parametrize(
    ("length", "raised"),
    [(64, 256), (128, 256), (255, 256), (256, None), (512, None), (32, None), (SENTINEL, None), (None, None)],
)
def test_a_length_from_the_base_context_up_to_the_patched_one_is_raised(length, raised):
    """Base context 64, patched 256: a tokenizer that said the base's context (or more, still below the new one) says
    the new one; one set below the base's, at or past the new one, or without a limit is kept."""
    assert raised_model_max_length(length, 64, 256) == raised
    assert raised_model_max_length(True, 0, 256) is None  # not a count


@pytest.mark.parametrize(("method", "params", "expected"), [("yarn", {"factor": 4}, 256), ("alibi", {}, 64)])
def test_a_saved_tokenizer_follows_the_patched_context(tmp_path, method, params, expected):
    """yarn ×4 on a model of 64 positions: the saved tokenizer_config.json says 256, every other key as saved; ALiBi
    keeps the context (and an unpatched config changes nothing)."""
    model = hf_posenc.patch(make_tiny("llama", max_position_embeddings=64), method, **params)
    tokenizer(64).save_pretrained(tmp_path)
    before = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert follow_context(tmp_path, model.config) == (expected if expected != 64 else None)
    after = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert after == {**before, "model_max_length": expected}
    assert follow_context(tmp_path, make_tiny("llama").config) is None


def test_a_push_with_weights_carries_the_patched_context_in_its_tokenizer(fake_hub):
    """The tokenizer pushed with a yarn ×4 model of 64 positions says 256 (vLLM served the pushed repo at 64 before);
    the tokenizer handed in still says 64."""
    upload_base()
    model = hf_posenc.patch(AutoModelForCausalLM.from_pretrained(BASE_REPO), "yarn", factor=4)
    handed_in = tokenizer(64)
    hub.push_to_hub(model, "me/yarn-tok", with_weights=True, tokenizer=handed_in)
    pushed = json.loads(fake_hub.files("me/yarn-tok")["tokenizer_config.json"])
    assert pushed["model_max_length"] == 256 and handed_in.model_max_length == 64


def test_a_trained_model_is_saved_with_a_tokenizer_of_its_context(tmp_path):
    """``train`` with pi ×2 on a model of 64 positions: the saved tokenizer says 128."""
    data = pack_windows([[3 + (i * i) % 11 for i in range(300)]], 32, eos_id=2, bos_id=1)
    settings = TrainSettings(length=32, steps=1, learning_rate=1e-3, save_steps=10)
    model = make_tiny("llama", max_position_embeddings=64)
    train(model, tokenizer(64), data, tmp_path / "out", settings, "pi:factor=2")
    assert saved_length(tmp_path / "out") == 128


def test_check_flags_a_tokenizer_that_caps_the_context(tmp_path, capsys):
    """A yarn ×4 config (256 positions) saved beside a tokenizer that says 64: a 'tokenizer' line, exit 1; the same
    folder once its tokenizer follows the context: exit 0, no such line."""
    model = hf_posenc.patch(make_tiny("llama", max_position_embeddings=64), "yarn", factor=4)
    model.config.save_pretrained(tmp_path)
    tokenizer(64).save_pretrained(tmp_path)
    assert main(["check", str(tmp_path)]) == 1
    line = "tokenizer | differs | tokenizer_config.json's model_max_length 64 is below max_position_embeddings 256"
    assert line in capsys.readouterr().out
    follow_context(tmp_path, model.config)
    assert main(["check", str(tmp_path / "config.json")]) == 0
    assert "tokenizer |" not in capsys.readouterr().out


def test_check_reads_the_tokenizer_of_a_hub_repo(fake_hub, tmp_path, capsys):
    model = hf_posenc.patch(make_tiny("llama", max_position_embeddings=64), "yarn", factor=4)
    model.config.save_pretrained(tmp_path)
    tokenizer(64).save_pretrained(tmp_path)
    api = HfApi(token=TOKEN)
    api.create_repo("me/capped")
    api.upload_folder(repo_id="me/capped", folder_path=tmp_path)
    assert main(["check", "me/capped", "--json"]) == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [f["engine"] for f in findings if f["severity"] != "ok"] == ["tokenizer"]


@pytest.mark.parametrize("length", [256, 1000, SENTINEL, None, "64", True])
def test_no_finding_for_a_tokenizer_at_or_past_the_context_or_without_a_number(length):
    assert tokenizer_findings({"max_position_embeddings": 256}, length) == []
    assert tokenizer_findings({}, 64) == []  # no context in the config
