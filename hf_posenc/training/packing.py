"""Training windows: documents' token ids packed into windows of exactly ``length`` tokens.

The documents are concatenated into one stream with the tokenizer's EOS token between them (none after the
last); the stream is cut into consecutive spans, and each window is ``[bos] + span`` (``length - 1`` stream
tokens) when the tokenizer adds a BOS token itself, else the span alone (``length`` stream tokens). The tail
of the stream too short for a span is dropped and counted. Nothing is padded, so every position is trained.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

IGNORE_INDEX = -100  # a label the loss leaves out (transformers' and torch's cross-entropy default)


@dataclass(frozen=True, eq=False)
class PackedWindows(Dataset):
    """The training windows, a `torch.utils.data.Dataset` of ``{"input_ids", "labels"}``: the labels are the window
    (the model shifts them itself) with its first token ignored (-100), which no position predicts. So the Trainer
    divides the summed loss by the tokens predicted for every model: it counts only ``labels[..., 1:]`` for a
    model whose ``loss_type`` names the causal LM loss, and GPT-2's is None (the loss was the mean NLL times
    ``(length - 1) / length``).

    Attributes:
        windows (`torch.LongTensor` of shape `(n, length)`): the windows, in stream order.
        stream_tokens (`int`): tokens of the stream (documents and the EOS tokens between them).
        dropped_tokens (`int`): stream tokens after the last whole window, not trained on.
        bos_id (`int`, *optional*): the BOS token starting every window, or None.
    """

    windows: torch.Tensor
    stream_tokens: int
    dropped_tokens: int
    bos_id: int | None

    def __len__(self) -> int:
        return self.windows.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        window = self.windows[index]
        return {"input_ids": window, "labels": torch.cat([window.new_full((1,), IGNORE_INDEX), window[1:]])}

    @property
    def length(self) -> int:
        return self.windows.shape[1]

    def fingerprint(self) -> str:
        """SHA-256 of the windows' token ids: the same data, tokenized the same way, packed the same way."""
        return hashlib.sha256(self.windows.numpy().tobytes()).hexdigest()


def pack_windows(
    documents: Sequence[Sequence[int]], length: int, *, eos_id: int | None, bos_id: int | None
) -> PackedWindows:
    """Pack the token ids of ``documents`` into windows of exactly ``length`` tokens.

    Args:
        documents (`Sequence[Sequence[int]]`): token ids of each document, without special tokens. Empty
            documents are left out (they would add a second EOS in a row).
        length (`int`): tokens per window, BOS included.
        eos_id (`int`, *optional*): separator between documents; None concatenates them directly.
        bos_id (`int`, *optional*): prepended to every window; None prepends nothing.

    Raises:
        ValueError: ``length`` below 2 (no token to predict), or the stream is shorter than one window.
    """
    if length < 2:  # the first token of a window is never predicted
        raise ValueError(f"`length` {length} leaves no token to predict in a window; use a `length` of 2 or more.")
    span = length - (bos_id is not None)
    separator = [] if eos_id is None else [eos_id]
    stream: list[int] = []
    for ids in (ids for ids in documents if len(ids)):
        stream += separator + list(ids) if stream else list(ids)
    count = len(stream) // span
    if count == 0:
        raise ValueError(
            f"The documents of `texts` make {len(stream)} tokens, fewer than one window of `length` {length} takes "
            f"({span} text tokens); give more text or a shorter `length`."
        )
    body = torch.tensor(stream[: count * span], dtype=torch.long).view(count, span)
    if bos_id is not None:
        body = torch.cat([torch.full((count, 1), bos_id, dtype=torch.long), body], dim=1)
    return PackedWindows(body, len(stream), len(stream) - count * span, bos_id)


def pack_texts(tokenizer, texts: Sequence[str], length: int) -> PackedWindows:
    """Tokenize ``texts`` (no special tokens) and pack them with :func:`pack_windows`: the tokenizer's EOS between
    documents, and its BOS at the start of each window iff it adds one itself (:func:`added_bos`)."""
    documents = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    return pack_windows(documents, length, eos_id=tokenizer.eos_token_id, bos_id=added_bos(tokenizer))


def added_bos(tokenizer) -> int | None:
    """The BOS id if the tokenizer prepends it to a text itself, else None: the model was trained with it (the
    rule of ``hf-posenc eval --bos auto``)."""
    bos = tokenizer.bos_token_id
    return bos if bos is not None and tokenizer("a")["input_ids"][:1] == [bos] else None
