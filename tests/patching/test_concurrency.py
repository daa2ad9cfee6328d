"""One model patched and unpatched from several threads at once ends patched with one method or unpatched,
never half of each; different models are patched in parallel without waiting for each other."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from helpers import assert_same, method_params, snapshot
from tiny_models import make_tiny

import hf_posenc
from hf_posenc.patching import apply

METHODS = ["yarn", "pi", "dynamic-ntk", "alibi"]
EXPECTED = ("is already patched with", "is not patched by hf_posenc")  # what losing a race may say


@pytest.fixture
def slow_planning(monkeypatch):
    """Planning takes a while, so that threads overlap between the "already patched?" check and the record."""
    real = apply.plan_method

    def slow(model, method, params):
        plan = real(model, method, params)
        time.sleep(0.005)
        return plan

    monkeypatch.setattr(apply, "plan_method", slow)


def _churn(model, method: str, rounds: int, start: threading.Barrier, errors: list[BaseException]) -> None:
    start.wait()
    for _ in range(rounds):
        for step in (
            lambda: hf_posenc.patch(model, method, **method_params(method, 8)),
            lambda: hf_posenc.unpatch(model),
        ):
            try:
                step()
            except RuntimeError as error:
                if not any(text in str(error) for text in EXPECTED):
                    errors.append(error)
            except BaseException as error:  # noqa: BLE001  (reported by the test, not lost in the thread)
                errors.append(error)


def _run(targets: list[tuple]) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(len(targets))
    threads = [threading.Thread(target=_churn, args=(*target, start, errors)) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    return errors


def _assert_consistent_then_original(model, before: dict) -> None:
    """Patched with one method (the record and get_patch agree) or not at all; unpatched, the original bit for bit."""
    info, record = hf_posenc.get_patch(model), getattr(model.config, "hf_posenc", None)
    assert (info is None) == (record is None)
    if info is not None:
        assert record["method"] == info.method
        hf_posenc.unpatch(model)
    assert_same(before, snapshot(model))
    hf_posenc.patch(model, "yarn", factor=2)  # patchable again, and unpatchable
    hf_posenc.unpatch(model)
    assert_same(before, snapshot(model))


def test_threads_patching_one_model_leave_it_consistent(slow_planning):
    model = make_tiny("llama")
    ids = torch.randint(0, 97, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids).logits
    before = snapshot(model)
    errors = _run([(model, method, 4) for method in METHODS * 2])
    assert errors == []
    _assert_consistent_then_original(model, before)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, logits)


def test_two_models_patched_at_once_each_get_their_own_method(slow_planning):
    models = [make_tiny("llama"), make_tiny("qwen2", seed=1)]
    befores = [snapshot(model) for model in models]
    errors = _run([(models[0], "yarn", 3), (models[0], "pi", 3), (models[1], "alibi", 3), (models[1], "ntk", 3)])
    assert errors == []
    for model, before in zip(models, befores, strict=True):
        _assert_consistent_then_original(model, before)


def test_one_models_patch_in_progress_does_not_block_another(monkeypatch):
    """The lock is per model: while ``first`` is being planned (held mid-patch), ``second`` patches and unpatches."""
    first, second = make_tiny("llama"), make_tiny("llama", seed=1)
    planning, release = threading.Event(), threading.Event()
    real = apply.plan_method

    def held(model, method, params):
        if model is first:
            planning.set()
            assert release.wait(timeout=60)
        return real(model, method, params)

    monkeypatch.setattr(apply, "plan_method", held)
    thread = threading.Thread(target=hf_posenc.patch, args=(first, "yarn"), kwargs={"factor": 2})
    thread.start()
    try:
        assert planning.wait(timeout=60)
        hf_posenc.patch(second, "pi", factor=2)
        assert hf_posenc.get_patch(second).method == "pi" and hf_posenc.get_patch(first) is None
        hf_posenc.unpatch(second)
    finally:
        release.set()
        thread.join(timeout=60)
    assert hf_posenc.get_patch(first).method == "yarn"
