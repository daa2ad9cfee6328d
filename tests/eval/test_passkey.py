"""Passkey prompts and accuracy (pure; the teacher-forced check is in test_eval_perplexity)."""

from __future__ import annotations

import pytest

from hf_posenc.eval.passkey import FILLER, INTRO, NEEDLE, QUESTION, accuracy_grid, build_prompt, random_keys


class CharTokenizer:
    """One token per character: lengths and positions are easy to compute by hand."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [ord(c) for c in text]}


def _text(ids: list[int]) -> str:
    return "".join(map(chr, ids))


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_prompt_fits_the_length_and_places_the_key_at_the_depth(depth):
    prompt = build_prompt(CharTokenizer(), 1000, depth, 12345, bos_id=7)
    ids = prompt.input_ids
    assert 1000 - len(FILLER) < len(ids) <= 1000
    assert ids[0] == 7 and _text(ids[1:]).startswith(INTRO)
    text = _text(ids[1:])
    assert _text(ids[prompt.answer_from :]) == " 12345"
    assert text[: -len(" 12345")].endswith(QUESTION)
    needle = NEEDLE.format(key=12345)
    before = text.index(needle) - len(INTRO)
    after = len(text) - len(" 12345") - len(QUESTION) - text.index(needle) - len(needle)
    assert before % len(FILLER) == 0 and after % len(FILLER) == 0
    assert before / (before + after) == pytest.approx(depth, abs=0.02)


def test_prompt_too_short_is_an_error():
    with pytest.raises(ValueError, match="too short for a passkey prompt"):
        build_prompt(CharTokenizer(), 200, 0.5, 12345)


def test_keys_are_five_digits_and_reproducible():
    keys = random_keys(50, seed=3)
    assert keys == random_keys(50, seed=3) and keys != random_keys(50, seed=4)
    assert all(10_000 <= k <= 99_999 for k in keys)


def test_accuracy_grid():
    trials = [
        {"method": "yarn", "length": 4096, "depth": 0.5, "correct": True},
        {"method": "yarn", "length": 4096, "depth": 0.5, "correct": False},
        {"method": "none", "length": 4096, "depth": 0.0, "correct": True},
        {"method": "yarn", "length": 1024, "depth": 0.5, "correct": True},
    ]
    assert accuracy_grid(trials) == [
        {"method": "yarn", "length": 1024, "depth": 0.5, "accuracy": 1.0, "trials": 1},
        {"method": "yarn", "length": 4096, "depth": 0.5, "accuracy": 0.5, "trials": 2},
        {"method": "none", "length": 4096, "depth": 0.0, "accuracy": 1.0, "trials": 1},
    ]
