"""Passkey retrieval: a random 5-digit key hidden at a depth in filler text; can the model repeat it?

The prompt follows Landmark Attention (Mohtashami & Jaggi 2023) and YaRN: an instruction, repeated
filler sentences, the key sentence at ``depth`` (0 = right after the instruction, 1 = right before the
question), then the question. A trial is correct when greedy decoding would produce the key's tokens
first and then no further digit, so that the first number of the answer is the key (tokenizers that
split numbers into digits would otherwise count ``604947`` for ``60494``): checked by teacher forcing,
one forward, no generation and no KV cache.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

INTRO = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information there."
)
SENTENCES = (
    " The grass is green.",
    " The sky is blue.",
    " The sun is yellow.",
    " Here we go.",
    " There and back again.",
)
FILLER = "".join(SENTENCES)
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
ANSWER = " {key}"


@dataclass(frozen=True)
class PasskeyPrompt:
    """Prompt and answer tokens together; positions ``answer_from …`` hold the key's tokens."""

    input_ids: list[int]
    answer_from: int
    key: int


def random_keys(count: int, seed: int) -> list[int]:
    """``count`` random 5-digit keys, reproducible from ``seed``."""
    rng = random.Random(seed)
    return [rng.randint(10_000, 99_999) for _ in range(count)]


def build_prompt(tokenizer, length: int, depth: float, key: int, bos_id: int | None = None) -> PasskeyPrompt:
    """A prompt of at most ``length`` tokens (answer included) with ``key`` at ``depth`` of the filler.

    Pieces are tokenized separately and joined as token lists: the filler is whole repeats of :data:`FILLER`,
    and the needle goes in at the sentence boundary nearest ``depth`` of the filler's tokens (the earlier one on
    a tie), so that every depth means what it says even when the filler repeats only a few times.
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"Depth {depth} must be between 0 and 1.")

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    prefix = ([] if bos_id is None else [bos_id]) + encode(INTRO)
    needle, question = encode(NEEDLE.format(key=key)), encode(QUESTION)
    answer, filler = encode(ANSWER.format(key=key)), encode(FILLER)
    room = length - len(prefix) - len(needle) - len(question) - len(answer)
    repeats = room // len(filler)
    if repeats < 1:
        raise ValueError(
            f"Length {length} is too short for a passkey prompt (needs at least {length - room + len(filler)})."
        )
    stream, cuts = filler * repeats, sentence_cuts(encode, filler)
    boundaries = [block * len(filler) + cut for block in range(repeats) for cut in cuts]
    target = depth * len(stream)
    before = min([*boundaries, len(stream)], key=lambda cut: abs(cut - target))
    prompt = prefix + stream[:before] + needle + stream[before:] + question
    return PasskeyPrompt(prompt + answer, len(prompt), key)


def sentence_cuts(encode, filler: list[int]) -> list[int]:
    """Where :data:`FILLER`'s tokens (``filler``) split between sentences (0 first): the token count of each run of
    its first sentences whose tokens begin the filler's (a tokenizer may merge tokens across a boundary: not a cut)."""
    cuts = [0]
    for count in range(1, len(SENTENCES)):
        head = encode("".join(SENTENCES[:count]))
        if filler[: len(head)] == head:
            cuts.append(len(head))
    return cuts


def ends_the_number(tokenizer, token_id: int) -> bool:
    """Whether greedy decoding's token after the key's tokens leaves the number as it is (no digit follows)."""
    return not tokenizer.decode([token_id])[:1].isdigit()


def accuracy_grid(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Accuracy per (method, length, depth) from trials ``{"method", "length", "depth", "correct"}``."""
    cells: dict[tuple, list[bool]] = {}
    for trial in trials:
        cells.setdefault((trial["method"], trial["length"], trial["depth"]), []).append(bool(trial["correct"]))
    order = {method: i for i, method in enumerate(dict.fromkeys(t["method"] for t in trials))}
    return [
        {"method": m, "length": n, "depth": d, "accuracy": sum(v) / len(v), "trials": len(v)}
        for (m, n, d), v in sorted(cells.items(), key=lambda item: (order[item[0][0]], *item[0][1:]))
    ]
