"""Runs of the ``hf-posenc eval`` / ``passkey`` commands on a tiny model saved to disk: the fixtures and
helpers the CLI and reliability tests share (a pytest plugin of conftest)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tiny_models import make_tiny
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from hf_posenc.eval import runner


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """A tiny Llama and a tiny GPT-2 (64 positions) with a character tokenizer, and 4 text documents of 20-300
    chars."""
    root = tmp_path_factory.mktemp("tiny")
    make_tiny("llama", max_position_embeddings=64).save_pretrained(root / "model")
    vocab = {"<unk>": 0, "<s>": 1, **{chr(c): i + 2 for i, c in enumerate(range(32, 127))}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", unk_token="<unk>")
    fast.save_pretrained(root / "model")
    make_tiny("gpt2").save_pretrained(root / "gpt2")  # a learned table of 64 positions
    fast.save_pretrained(root / "gpt2")
    (root / "texts").mkdir()
    rng = random.Random(0)
    for i, n in enumerate([300, 90, 20, 171]):
        (root / "texts" / f"{i}.txt").write_text("".join(rng.choice("abcdefgh ijk.") for _ in range(n)))
    return root


def eval_args(tiny_dir: Path, output: Path) -> list[str]:
    return ["eval", "--model", str(tiny_dir / "model"), "--dataset", str(tiny_dir / "texts"), "--output", str(output)]


def results_of(output: Path) -> dict:
    return json.loads((output / "results.json").read_text())


def folder_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model must not be loaded")

    monkeypatch.setattr(runner, "load_model_at_commit", refuse)


@pytest.fixture
def nothing_loaded(monkeypatch, no_model_load):
    def refuse(*args, **kwargs):
        raise AssertionError("the tokenizer must not be loaded")

    monkeypatch.setattr(runner, "load_tokenizer", refuse)
