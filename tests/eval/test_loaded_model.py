"""A model already in memory, scored where it is: the same numbers as the same model loaded from its folder, the model
given back unpatched and unchanged; a patched model or no tokenizer refused before anything is written."""

from __future__ import annotations

import json
import logging

import pytest
from helpers import assert_same, snapshot
from tiny_models import make_tiny
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_posenc
from hf_posenc.eval import (
    LoadedModel,
    ModelSource,
    PasskeyConfig,
    PerplexityConfig,
    TextSource,
    run_passkey,
    run_perplexity,
)
from hf_posenc.tuning import TuneConfig, run_tune
from hf_posenc.tuning.winner import save_winner

METHODS = ["none", "yarn:factor=4", "self-extend"]


def _loaded(tiny_dir) -> LoadedModel:
    folder = tiny_dir / "model"
    return LoadedModel(AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder))


def test_a_loaded_model_scores_as_its_folder_and_is_given_back_unchanged(tiny_dir, tmp_path):
    loaded, texts = _loaded(tiny_dir), TextSource(str(tiny_dir / "texts"))
    before = snapshot(loaded.model)
    config = PerplexityConfig(lengths=[32, 128], methods=METHODS)
    ours = run_perplexity(loaded, texts, config, tmp_path / "loaded")
    named = run_perplexity(ModelSource(str(tiny_dir / "model")), texts, config, tmp_path / "named")
    assert [(r.method, r.length, r.nll, r.tokens) for r in ours.results] == [
        (r.method, r.length, r.nll, r.tokens) for r in named.results
    ]
    assert ours.model_details["name"] == named.model_details["name"] == str((tiny_dir / "model").resolve())
    assert ours.model_details["fingerprint"] == named.model_details["fingerprint"]
    assert ours.model_details["commit"] is None and ours.model_details["dtype"] == "float32"
    assert hf_posenc.get_patch(loaded.model) is None and not loaded.model.training
    assert_same(before, snapshot(loaded.model))
    again = run_perplexity(loaded, texts, PerplexityConfig(lengths=[32, 128], methods=["none"]), tmp_path / "loaded")
    resumed = {(r.method, r.length): r.nll for r in again.results}  # the same model: nothing new computed
    assert resumed == {(r.method, r.length): r.nll for r in ours.results}


def test_a_loaded_model_passes_the_passkey_as_its_folder(tiny_dir, tmp_path):
    config = PasskeyConfig(lengths=[400], methods=["none", "pi:factor=8"], depths=[0.0, 1.0], trials=2)
    ours = run_passkey(_loaded(tiny_dir), config, tmp_path / "loaded")
    named = run_passkey(ModelSource(str(tiny_dir / "model")), config, tmp_path / "named")
    assert ours.trials == named.trials and ours.accuracy == named.accuracy


def test_a_tune_of_a_loaded_model_names_its_folder_or_saves_no_winner(tiny_dir, tmp_path, caplog):
    texts, config = TextSource(str(tiny_dir / "texts")), TuneConfig(methods=["yarn"], logn=False, max_regression=1.0)
    report = run_tune(_loaded(tiny_dir), texts, config, tmp_path / "named")
    assert report.best is not None
    metadata = json.loads((tmp_path / "named" / "best" / "hf_posenc.json").read_text())
    assert metadata["base_model"] == str(tiny_dir / "model")
    built = make_tiny("llama", max_position_embeddings=64)  # the same shape, from a config: no name to load by
    tokenizer = _loaded(tiny_dir).tokenizer
    with caplog.at_level(logging.WARNING, logger="hf_posenc"):
        assert save_winner(LoadedModel(built, tokenizer), report, tmp_path / "built") is None
        built.name_or_path = str(tmp_path)  # a folder that holds no config.json (a GGUF file's, say)
        assert save_winner(LoadedModel(built, tokenizer), report, tmp_path / "gguf") is None
    assert not (tmp_path / "built").exists() and not (tmp_path / "gguf").exists()
    assert "its model was built in memory, and no name loads its weights" in caplog.text
    assert f"the folder {tmp_path} holds no config.json" in caplog.text


def test_the_two_line_tune_of_a_model_and_texts_in_memory_ranks_as_the_named_tune(tiny_dir, tmp_path, monkeypatch):
    texts = [path.read_text() for path in sorted((tiny_dir / "texts").glob("*.txt"))]
    options = {"methods": ["yarn", "self-extend"], "logn": False, "max_regression": 1.0}
    named = run_tune(
        ModelSource(str(tiny_dir / "model")), TextSource(str(tiny_dir / "texts")), TuneConfig(**options), tmp_path
    )
    loaded = _loaded(tiny_dir)
    monkeypatch.chdir(tmp_path)
    ours = hf_posenc.tune(loaded.model, loaded.tokenizer, texts, **options)
    assert ours.target_length == named.target_length == 128  # twice the trained 64
    assert [(r.method, r.nll, r.regression, r.rank) for r in ours.rows] == [
        (r.method, r.nll, r.regression, r.rank) for r in named.rows
    ]
    assert ours.best == named.best and ours.dataset == "texts"
    assert (tmp_path / "hf-posenc-results" / "tune-model" / "tune.json").is_file()  # the CLI's default folder
    assert hf_posenc.get_patch(loaded.model) is None


def test_a_patched_model_or_no_tokenizer_is_refused(tiny_dir):
    loaded = _loaded(tiny_dir)
    hf_posenc.patch(loaded.model, "yarn", factor=2)
    with pytest.raises(ValueError, match=r"patched with 'yarn': give it unpatched"):
        LoadedModel(loaded.model, loaded.tokenizer)
    with pytest.raises(ValueError, match="needs its `tokenizer`"):
        LoadedModel(make_tiny("llama"), None)
