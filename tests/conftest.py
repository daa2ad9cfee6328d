"""Shared fixtures: tiny random models of each supported family, and the real offline model (the fake Hub and
the tiny model saved for the eval commands come from the plugins hub_server and tiny_runs)."""

from __future__ import annotations

import os

import pytest
import torch
from tiny_models import CONFIGS, make_tiny
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
)

pytest_plugins = ("hub_server", "tiny_runs")  # the fake_hub fixture; tiny_dir and eval runs on it


def pytest_collection_modifyitems(items):
    """The tests of the xdist groups first, in their order otherwise: each group runs on one worker and is among the
    longest units of work, so a group started last would run alone after every other test has finished."""
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)


def pytest_configure(config):
    """Under pytest-xdist, each worker takes its share of the cores' intra-op threads: two workers with two threads
    each on two cores spin-wait on each other."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, torch.get_num_threads() // workers))


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine two threads spin-wait on each
    other: one thread runs a module of tiny-model tests many times faster there."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=sorted(CONFIGS))
def tiny_family(request) -> str:
    return request.param


@pytest.fixture
def tiny_model(tiny_family):
    return make_tiny(tiny_family)


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of the real offline SmolLM2-135M (float32, eval). Skips if not installed."""
    from hf_posenc.offline import smollm2_gguf

    try:
        folder, name = smollm2_gguf()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    return model, tokenizer


@pytest.fixture(scope="session")
def essay_ids(smollm2) -> torch.Tensor:
    """The bundled essays joined and tokenized once: a (1, ~154k) LongTensor."""
    from hf_posenc.offline import essays_dir

    _, tokenizer = smollm2
    text = "\n\n".join(p.read_text(encoding="utf-8") for p in sorted(essays_dir().glob("*.txt")))
    return tokenizer(text, return_tensors="pt").input_ids
