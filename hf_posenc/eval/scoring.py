"""Scoring on one or many processes: each process takes its contiguous share, results gathered once.

Each process holds the whole model and scores its share of the forwards or prompts
(``split_between_processes``, uneven shares allowed, no padding); the results are gathered once and
checked to cover every item exactly once, in order, so 1 and N processes give the same numbers.

Windows of several lengths that start at the same token of a document (the ``truncate`` protocol's) can
share one forward: in a causal model whose output at a position does not depend on the input's length,
the losses of the first ``n`` tokens of the longest window are those of the window of ``n`` tokens.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from tqdm.auto import tqdm

from ..architectures import depends_on_length
from ..registry import get_method
from ..spec import NONE_METHOD
from .data import Window
from .models import input_device
from .passkey import PasskeyPrompt, ends_the_number
from .perplexity import DEFAULT_CHUNK_SIZE, cumulative_nll, greedy_continuation


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


@dataclass(frozen=True)
class Forward:
    """One model input: ``window``, the window of ``length``, read once; ``serves`` lists ``(length, index)`` of
    every window it scores (itself included), each a prefix of it: same document, start and first scored token."""

    window: Window
    length: int
    serves: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class LengthScore:
    """One length's windows scored: ``(summed NLL, tokens)`` of each in plan order; how many were read by a
    forward of their own; those forwards' seconds on this process (a pass's other time, gathering, goes to
    its longest length); the longest length whose forwards the other windows were read from, or None; with
    ``blocks`` asked for, each window's scored tokens cut into that many contiguous blocks, ``(summed NLL, tokens)``
    of each, window after window (:func:`block_sums`)."""

    windows: list[tuple[float, int]]
    forwards: int
    seconds: float
    derived_from: int | None
    blocks: list[tuple[float, int]] | None = None


def block_sums(running: torch.Tensor, blocks: int) -> list[tuple[float, int]]:
    """``(summed NLL, tokens)`` of ``blocks`` contiguous blocks of a window's scored tokens, as even as whole tokens
    allow, read from its running sums (:func:`~hf_posenc.eval.perplexity.cumulative_nll`: entry ``k`` sums the first
    ``k + 1`` tokens). The blocks' means give the spread of the window's mean (batch means): the tokens of one
    document are not independent, blocks of hundreds of them nearly are."""
    scored = running.shape[0]
    ends = [round(scored * (b + 1) / blocks) for b in range(blocks)]
    sums, before, start = [], 0.0, 0
    for end in ends:
        if end > start:
            total = running[end - 1].item()
            sums.append((total - before, end - start))
            before, start = total, end
    return sums


def serves_every_length(model, method: str) -> bool:
    """Whether one forward of ``model`` (unpatched here) patched with ``method`` (``"none"``: as it is) scores
    every shorter window of its input exactly: neither the model nor the method depends on the input's length."""
    return not depends_on_length(model) and (method == NONE_METHOD or not get_method(method).depends_on_length)


def plan_forwards(plans: dict[int, list[Window]]) -> list[Forward]:
    """The forwards that score every window of ``plans`` (length -> windows), in document order: windows of
    one document with the same start and first scored token share the forward of the longest of them."""
    groups: dict[tuple[int, int, int], list[tuple[int, int, Window]]] = {}
    for length, windows in sorted(plans.items()):
        for index, window in enumerate(windows):
            groups.setdefault((window.doc, window.start, window.score_from), []).append((length, index, window))
    forwards = []
    for key in sorted(groups):
        length, _, window = max(groups[key], key=lambda member: (member[2].end, member[0]))
        forwards.append(Forward(window, length, tuple((n, i) for n, i, _ in groups[key])))
    return forwards


def score_lengths(
    model,
    docs: list[list[int]],
    plans: dict[int, list[Window]],
    *,
    accelerator: Accelerator,
    bos_id: int | None = None,
    batch_size: int = 1,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    desc: str = "",
    blocks: int = 1,
) -> dict[int, LengthScore]:
    """Every window of ``plans`` (length -> windows) scored, on every process, each window's NLL read from the
    forward :func:`plan_forwards` gives it (pass one length at a time for one forward per window). ``blocks`` > 1:
    each window's NLL by blocks of its tokens too (:func:`block_sums`).

    Raises:
        `RuntimeError`: the gathered results do not cover each forward exactly once.
    """
    start = time.perf_counter()
    bos = bos_id is not None
    forwards = plan_forwards(plans)
    seconds = dict.fromkeys(plans, 0.0)
    with (
        accelerator.split_between_processes(list(range(len(forwards)))) as mine,
        _LayerProgress(model, len(mine), desc, accelerator.is_local_main_process) as progress,
    ):
        records = []
        for batch in _batches(mine, [f.window for f in forwards], bos, batch_size):
            begin = time.perf_counter()
            windows = [window_ids(docs, forwards[i].window, bos_id) for i in batch]
            ids = torch.tensor(windows, device=input_device(model))
            with progress.counting(len(batch)):
                sums = cumulative_nll(model, ids, input_shape(forwards[batch[0]].window, bos)[1], chunk_size).cpu()
            seconds[forwards[batch[0]].length] += time.perf_counter() - begin
            for row, i in enumerate(batch):
                served = _served(model, docs, plans, forwards[i], sums[row], bos_id, chunk_size, seconds)
                records.append((i, [(*entry, _blocks_of(entry, sums[row], blocks)) for entry in served]))
    gathered = _gathered(records, len(forwards), "forwards")
    seconds[max(plans)] += time.perf_counter() - start - sum(seconds.values())
    return {n: _length_score(n, windows, forwards, gathered, seconds[n], blocks) for n, windows in plans.items()}


def _blocks_of(entry: tuple, running: torch.Tensor, blocks: int) -> list[tuple[float, int]] | None:
    """The blocks of a window :func:`_served` read (``(length, index, nll, tokens, read alone)``): from the forward's
    running sums, its first ``tokens`` entries; a window read again alone has no blocks to read (it was not finite)
    and gets one, its whole NLL."""
    _, _, nll, tokens, alone = entry
    if blocks <= 1:
        return None
    return [(nll, tokens)] if alone else block_sums(running[:tokens], blocks)


class _LayerProgress:
    """The progress bar of a process's forwards, counted in the layers of a model on the CPU (its decoder's blocks,
    those transformers names in ``_no_split_modules``), so that one long forward (16k tokens: minutes) moves it too.
    Counted in forwards on a GPU, where a layer's hook runs when its kernels are queued, not done, and where the model
    names no blocks."""

    def __init__(self, model, forwards: int, desc: str, shown: bool) -> None:
        names = set(getattr(model, "_no_split_modules", None) or ()) if shown else set()
        on_cpu = input_device(model).type == "cpu"
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else model  # not a vision tower's blocks
        self.layers = [module for module in decoder.modules() if type(module).__name__ in names] if on_cpu else []
        steps = len(self.layers) or 1
        plural = "s" if forwards != 1 else ""
        label = f"{desc} ({forwards} forward{plural} of {steps} layers)" if self.layers else desc
        unit = "layer" if self.layers else "forward"
        self.bar = tqdm(total=forwards * steps, desc=label, unit=unit, disable=not shown)
        self.windows = 0  # of the forward counted now; 0 outside (a window read again alone moves nothing)
        self.handles: list = []

    def __enter__(self) -> _LayerProgress:
        self.handles = [layer.register_forward_hook(self._tick) for layer in self.layers]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()
        self.bar.close()

    def _tick(self, *_: object) -> None:
        self.bar.update(self.windows)

    @contextlib.contextmanager
    def counting(self, windows: int) -> Iterator[None]:
        """Count the forward run inside, of ``windows`` windows."""
        self.windows = windows
        try:
            yield
        finally:
            self.windows = 0
        if not self.layers:
            self.bar.update(windows)


def _served(
    model,
    docs: list[list[int]],
    plans: dict[int, list[Window]],
    forward: Forward,
    sums: torch.Tensor,
    bos_id: int | None,
    chunk_size: int,
    seconds: dict[int, float],
) -> list[tuple[int, int, float, int, bool]]:
    """``(length, index, nll, tokens, read alone)`` of each window ``forward`` serves, read from its running NLL sums.
    A non-finite NLL of a shorter window is read again from a forward of its own, timed into ``seconds[length]``: a
    NaN or an overflow later in the longer input reaches earlier positions too (the causal mask is added to the
    logits, and NaN plus a mask is NaN)."""
    entries = []
    for length, index in forward.serves:
        window = plans[length][index]
        nll, alone = sums[window.scored - 1].item(), False
        if not math.isfinite(nll) and window.end < forward.window.end:
            begin = time.perf_counter()
            ids = torch.tensor([window_ids(docs, window, bos_id)], device=input_device(model))
            nll = cumulative_nll(model, ids, input_shape(window, bos_id is not None)[1], chunk_size)[0, -1].item()
            seconds[length] += time.perf_counter() - begin
            alone = True
        entries.append((length, index, nll, window.scored, alone))
    return entries


def _length_score(
    length: int, windows: list[Window], forwards: list[Forward], gathered: list, seconds: float, blocks: int = 1
) -> LengthScore:
    """``length``'s :class:`LengthScore` from the gathered ``(forward index, [(length, index, nll, tokens, read
    alone, blocks)])``."""
    entries = [(i, k, *rest) for i, served in gathered for n, k, *rest in served if n == length]
    scored = sorted((k, (nll, tokens), parts) for _, k, nll, tokens, _, parts in entries)
    if [k for k, _, _ in scored] != list(range(len(windows))):
        raise RuntimeError(f"Gathered {len(scored)} results for {len(windows)} windows of length {length}.")
    sources = [length if alone else forwards[i].length for i, _, _, _, alone, _ in entries]
    derived = [source for source in sources if source != length]
    parts = [part for _, _, window_parts in scored for part in window_parts] if blocks > 1 else None
    return LengthScore(
        [value for _, value, _ in scored], len(sources) - len(derived), seconds, max(derived, default=None), parts
    )


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
        ids = torch.tensor([prompts[i].input_ids], device=input_device(model))
        matches, after = greedy_continuation(model, ids, prompts[i].answer_from)
        return bool(matches[0]) and ends_the_number(tokenizer, int(after[0]))

    return map_split(accelerator, len(prompts), correct, desc)
