"""Passkey prompts and accuracy (pure; the teacher-forced check is in test_eval_perplexity)."""

from __future__ import annotations

import pytest

from hf_posenc.eval.passkey import (
    FILLER,
    INTRO,
    NEEDLE,
    QUESTION,
    SENTENCES,
    accuracy_grid,
    build_prompt,
    random_keys,
)


class CharTokenizer:
    """One token per character: lengths and positions are easy to compute by hand."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [ord(c) for c in text]}


def _text(ids: list[int]) -> str:
    return "".join(map(chr, ids))


@pytest.mark.parametrize("length", [1000, 420, 560])  # 7, 2 and 3 repeats of the filler
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.25, 0.5, 0.7, 1.0])
def test_prompt_fits_the_length_and_places_the_key_at_the_depth(depth, length):
    """The needle at the sentence boundary nearest ``depth`` of the filler (half the longest sentence away at
    most), the filler whole repeats around it: with few repeats too, each depth is where it says."""
    prompt = build_prompt(CharTokenizer(), length, depth, 12345, bos_id=7)
    ids = prompt.input_ids
    assert length - len(FILLER) < len(ids) <= length
    assert ids[0] == 7 and _text(ids[1:]).startswith(INTRO)
    text = _text(ids[1:])
    assert _text(ids[prompt.answer_from :]) == " 12345"
    assert text[: -len(" 12345")].endswith(QUESTION)
    needle = NEEDLE.format(key=12345)
    start = text.index(needle)
    filler = text[len(INTRO) : start] + text[start + len(needle) : -len(QUESTION + " 12345")]
    assert filler == FILLER * (len(filler) // len(FILLER))
    before = start - len(INTRO)
    assert before % len(FILLER) in {len("".join(SENTENCES[:count])) for count in range(len(SENTENCES))}
    assert abs(before - depth * len(filler)) <= max(map(len, SENTENCES)) / 2


def test_few_repeats_give_each_depth_its_own_place():
    """Two repeats of the filler (ten sentences): depths a quarter apart are different prompts."""
    places = {build_prompt(CharTokenizer(), 420, depth, 12345).answer_from for depth in (0, 0.25, 0.5, 0.75, 1)}
    prompts = [tuple(build_prompt(CharTokenizer(), 420, depth, 12345).input_ids) for depth in (0, 0.25, 0.5, 0.75, 1)]
    assert len(places) == 1 and len(set(prompts)) == 5


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
