"""Scoring on one or many processes: each process takes its contiguous share, results gathered once.

Each process holds the whole model and scores its share of the windows or prompts
(``split_between_processes``, uneven shares allowed, no padding); the results are gathered once and
checked to cover every item exactly once, in order, so 1 and N processes give the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from tqdm.auto import tqdm

from .data import Window
from .passkey import PasskeyPrompt, ends_the_number
from .perplexity import DEFAULT_CHUNK_SIZE, greedy_continuation, window_nll


def input_shape(window: Window, bos: bool) -> tuple[int, int]:
    """``(input length, first scored position)`` of ``window``'s model input."""
    return window.end - window.start + bos, window.score_from - window.start + bos


def window_ids(docs: list[list[int]], window: Window, bos_id: int | None) -> list[int]:
    prefix = [] if bos_id is None else [bos_id]
    return prefix + docs[window.doc][window.start : window.end]


def _batches(indices: list[int], windows: list[Window], bos: bool, batch_size: int) -> Iterator[list[int]]:
    """Consecutive windows of equal input length and scored offset, at most ``batch_size`` together."""
    batch: list[int] = []
    for i in indices:
        key = input_shape(windows[i], bos)
        if batch and (len(batch) == batch_size or input_shape(windows[batch[0]], bos) != key):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def _gathered(records: list[tuple[int, Any]], count: int, what: str) -> list[tuple[int, Any]]:
    """Every process's ``(index, value)`` records, sorted; ``RuntimeError`` unless each index comes once."""
    gathered = sorted(gather_object(records))
    if [index for index, _ in gathered] != list(range(count)):
        raise RuntimeError(f"Gathered {len(gathered)} results for {count} {what}.")
    return gathered


def score_windows(
    model,
    docs: list[list[int]],
    windows: list[Window],
    *,
    accelerator: Accelerator,
    bos_id: int | None = None,
    batch_size: int = 1,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    desc: str = "",
) -> list[tuple[int, float, int]]:
    """``(window index, summed NLL, tokens scored)`` of every window, on every process, in window order.

    Raises:
        `RuntimeError`: the gathered results do not cover each window exactly once.
    """
    bos = bos_id is not None
    with accelerator.split_between_processes(list(range(len(windows)))) as mine:
        records = []
        bar = tqdm(total=len(mine), desc=desc, unit="window", disable=not accelerator.is_local_main_process)
        for batch in _batches(mine, windows, bos, batch_size):
            ids = torch.tensor([window_ids(docs, windows[i], bos_id) for i in batch], device=accelerator.device)
            nll = window_nll(model, ids, input_shape(windows[batch[0]], bos)[1], chunk_size).tolist()
            records += [(i, (value, windows[i].scored)) for i, value in zip(batch, nll, strict=True)]
            bar.update(len(batch))
        bar.close()
    return [(i, nll, scored) for i, (nll, scored) in _gathered(records, len(windows), "windows")]


def map_split(accelerator: Accelerator, count: int, fn: Callable[[int], Any], desc: str) -> list:
    """``[fn(0), …, fn(count - 1)]``, the indices split across processes, gathered once, checked."""
    with accelerator.split_between_processes(list(range(count))) as mine:
        bar = tqdm(mine, desc=desc, unit="prompt", disable=not accelerator.is_local_main_process)
        records = [(i, fn(i)) for i in bar]
    return [value for _, value in _gathered(records, count, "items")]


def passkey_flags(model, tokenizer, prompts: list[PasskeyPrompt], accelerator: Accelerator, desc: str) -> list[bool]:
    """Whether each prompt is answered correctly (the key, then no further digit), prompts split across
    processes."""

    def correct(i: int) -> bool:
        ids = torch.tensor([prompts[i].input_ids], device=accelerator.device)
        matches, after = greedy_continuation(model, ids, prompts[i].answer_from)
        return bool(matches[0]) and ends_the_number(tokenizer, int(after[0]))

    return map_split(accelerator, len(prompts), correct, desc)
