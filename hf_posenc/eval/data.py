"""Texts through `datasets`, tokenization, and the evaluation windows of each protocol.

A window is a span of one tokenized document that the model reads in one forward, and the part of
it that is scored. Window construction is pure: it sees only document lengths, so tests check its
properties (every token scored at most once, only earlier tokens of the same span in its context).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from ..hub.errors import refuse_missing_folder
from ..hub.reach import cache_only_if_unreachable
from .local_files import LOCAL_SPLIT, local_rows

PROTOCOLS = ("sliding", "disjoint", "truncate")
PROTOCOL_HELP = {
    "sliding": "windows of LENGTH tokens every STRIDE tokens; each scores only the tokens the previous "
    "window did not reach (the transformers docs recipe), so every scored token but the first ones has "
    "at least LENGTH-STRIDE tokens of context",
    "disjoint": "non-overlapping windows of LENGTH tokens; the tail of a document shorter than a window is "
    "dropped and counted",
    "truncate": "one window per document: its first LENGTH tokens (YaRN's evaluation)",
}
DEFAULT_SPLIT = "test"
IN_MEMORY_NAME = "texts"
_LENGTH_RE = re.compile(r"^\s*(\d+)\s*([kK]?)\s*$")


@dataclass(frozen=True)
class Window:
    """Tokens ``[start, end)`` of document ``doc`` are read; tokens ``[score_from, end)`` are scored.

    With a BOS token prepended the model input is ``[bos] + doc[start:end]`` and ``score_from`` may equal
    ``start``; without it ``score_from > start`` (the first token of a span has no context).
    """

    doc: int
    start: int
    end: int
    score_from: int

    @property
    def scored(self) -> int:
        return self.end - self.score_from


@dataclass(frozen=True)
class WindowPlan:
    """The windows of one context length, and what the protocol left out (counted, never padded): documents
    shorter than a span, and tokens of the scored documents in no window. ``documents``: those scored (fewer
    than the data's minus the skipped ones under ``max_windows``)."""

    windows: list[Window]
    skipped_documents: int
    dropped_tokens: int
    documents: int


@dataclass(frozen=True)
class TextSource:
    """Where the texts come from: a Hub dataset name, a local file or folder (.txt, .jsonl, .parquet), or texts in
    memory (:meth:`from_texts`).

    Args:
        path (`str`): Hub dataset id (``emozilla/pg19-test``) or a local path; for texts in memory, their name.
        config (`str`, *optional*): dataset configuration (``wikitext-103-raw-v1``).
        split (`str`, *optional*): split of a Hub dataset, ``"test"`` if not given. Local files are read
            whole, as the split ``"train"``; another split or a config for them is an error.
        text_column (`str`, defaults to ``"text"``): column holding the documents.
        streaming (`bool`, defaults to `False`): stream instead of downloading the whole split.
        max_documents (`int`, *optional*): read only the first documents.
        join (`str`, *optional*): join all documents with this separator into one stream.
        texts (`tuple[str, ...]`, *optional*): the documents themselves; ``path`` only names them.
    """

    path: str
    config: str | None = None
    split: str | None = None
    text_column: str = "text"
    streaming: bool = False
    max_documents: int | None = None
    join: str | None = None
    texts: tuple[str, ...] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.max_documents is not None and (isinstance(self.max_documents, bool) or self.max_documents < 1):
            raise ValueError(f"`max_documents` must be a whole number >= 1, got {self.max_documents!r}.")
        if self.texts is None:
            return
        documents = _documents(self.texts)
        hub_only = [name for name in ("config", "split", "streaming") if getattr(self, name)]
        if hub_only or self.text_column != "text":
            raise ValueError(f"`{(hub_only or ['text_column'])[0]}` reads a dataset; texts given as strings have none.")
        object.__setattr__(self, "texts", documents)  # frozen: a list given would make it unhashable

    @classmethod
    def from_texts(
        cls,
        texts: Sequence[str],
        name: str = IN_MEMORY_NAME,
        *,
        max_documents: int | None = None,
        join: str | None = None,
    ) -> TextSource:
        """Documents given as strings (``["first document", "second"]``), named ``name`` in reports. Raises
        ``ValueError`` for no documents or one that is not a string (a file or folder is ``TextSource(path)``)."""
        return cls(name, max_documents=max_documents, join=join, texts=_documents(texts))

    @property
    def on_hub(self) -> bool:
        """Whether the texts are a Hub dataset (not local files, not texts in memory)."""
        return self.texts is None and self.local is None

    @property
    def local(self) -> Path | None:
        """The local file or folder, or None for a Hub dataset or texts in memory."""
        if self.texts is not None:
            return None
        path = Path(self.path).expanduser()
        return path if path.exists() else None

    @property
    def label(self) -> str:
        """Short name for tables and plots: the Hub id, or the last two parts of a local path."""
        return "/".join(self.local.parts[-2:]) if self.local else self.path

    @property
    def read_split(self) -> str | None:
        """The split actually read: ``train`` for local files (how `datasets` names them), none for texts in
        memory, else ``split``."""
        if self.texts is not None:
            return None
        return LOCAL_SPLIT if self.local else self.split or DEFAULT_SPLIT

    def describe(self) -> dict:
        """The source as recorded in results (a resume compares it): texts in memory by count and SHA-256."""
        if self.texts is not None:
            return {"name": self.path, "texts": len(self.texts), "sha256": self._digest, **self._selection()}
        return {
            "name": self.path,
            "config": self.config,
            "split": self.read_split,
            "text_column": self.text_column,
            **self._selection(),
        }

    @cached_property
    def _digest(self) -> str:
        """SHA-256 of the texts in memory, each preceded by its length: other texts, or the same texts cut elsewhere,
        differ."""
        digest = hashlib.sha256()
        for text in self.texts or ():
            data = text.encode()
            digest.update(len(data).to_bytes(8, "little") + data)
        return digest.hexdigest()

    def _selection(self) -> dict:
        return {"max_documents": self.max_documents, "join": self.join}


def _documents(texts: Iterable[str]) -> tuple[str, ...]:
    """``texts`` as a tuple of documents; ``ValueError`` for no documents, or anything but strings."""
    if isinstance(texts, (str, bytes, Path)) or not isinstance(texts, Iterable):
        raise ValueError(
            f"`texts` must be a list of strings, one per document, got {type(texts).__name__}; a file or folder is "
            "read by TextSource(path)."
        )
    documents = tuple(texts)
    if not all(isinstance(text, str) for text in documents):
        raise ValueError("`texts` must be a list of strings, one per document.")
    if not documents:
        raise ValueError("`texts` holds no documents.")
    return documents


MAX_TOKENS = 2**24  # 16384k: longer than any context evaluated; a longer window is a typo, not a run


def parse_length(text: str) -> int:
    """``"16k"`` -> 16384, ``"512"`` -> 512 (``k`` = 1024), at most :data:`MAX_TOKENS`. Raises ``ValueError``
    for anything else."""
    match = _LENGTH_RE.match(str(text))
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"{text!r} is not a positive number of tokens (examples: 512, 4k, 32k).")
    length = int(match.group(1)) * (1024 if match.group(2) else 1)
    if length > MAX_TOKENS:
        raise ValueError(f"{text!r} is more than {MAX_TOKENS // 1024}k tokens, longer than any window evaluated.")
    return length


def parse_lengths(text: str) -> list[int]:
    """``"2k,4k,8k"`` -> [2048, 4096, 8192]: sorted, duplicates removed."""
    parts = [part for part in str(text).split(",") if part.strip()]
    if not parts:
        raise ValueError(f"No lengths in {text!r}; expected a comma-separated list such as 2k,4k,8k.")
    return sorted({parse_length(part) for part in parts})


def check_output_outside(output: Path, source: TextSource) -> None:
    """Raise ``ValueError`` if ``output`` is a local data folder or inside one: the next run (a resume) would read
    the files written there (results; a trained model and its checkpoints) as documents."""
    folder = source.local
    if folder is not None and folder.is_dir() and output.resolve().is_relative_to(folder.resolve()):
        raise ValueError(
            f"`output` {output} is inside the `dataset` folder {folder}, whose files are all read as documents: "
            "what this run writes there would be read as data by the next run (a resume). Choose an `output` "
            "outside it."
        )


def check_protocol(protocol: str, stride: int | None, lengths: Sequence[int] = (), bos: bool = False) -> None:
    """Raise ``ValueError`` for an unknown protocol, a stride given to a protocol that has none, or a stride longer
    than the text tokens of the shortest of ``lengths`` (one fewer with ``bos``: a sliding window would skip
    tokens)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"Unknown protocol {protocol!r}; choose one of {PROTOCOLS}.")
    if stride is not None and protocol != "sliding":
        raise ValueError(
            f"`stride` applies to `protocol` sliding; `protocol` {protocol} does not use it. "
            "Leave `stride` out, or use `protocol` sliding."
        )
    if stride is not None and lengths and stride > min(lengths) - bos:
        text = min(lengths) - bos
        what = f"the {text} text tokens after BOS of the shortest length" if bos else f"the shortest length, {text}"
        raise ValueError(
            f"`stride` {stride} must be at most {what}: a window sliding further than its own text skips the tokens "
            "between."
        )


def load_texts(source: TextSource) -> list[str]:
    """The documents of ``source``: texts in memory as given, else read with `datasets`; errors name the bad
    dataset, local file or column."""
    texts = list(source.texts) if source.texts is not None else _column_texts(source, _open_dataset(source))
    texts = texts[: source.max_documents]
    if not texts:
        raise ValueError(f"Dataset {source.path!r} has no documents.")
    return [source.join.join(texts)] if source.join is not None else texts


def _open_dataset(source: TextSource):
    """The rows of a local file or folder, or of a Hub dataset's split (a cached one at once offline)."""
    from datasets import load_dataset

    local = source.local
    if local:
        if source.config is not None or source.split not in (None, LOCAL_SPLIT):
            raise ValueError(
                f"{local} is local: its files are read whole, so `config` and `split` (Hub datasets "
                "only) do not apply. Leave them out."
            )
        return local_rows(local, source.streaming)
    try:
        refuse_missing_folder(source.path)
    except FileNotFoundError as error:
        raise ValueError(f"Cannot load dataset {error}.") from None
    with cache_only_if_unreachable(source.path, dataset=True) as unreachable:
        try:
            return load_dataset(source.path, source.config, split=source.read_split, streaming=source.streaming)
        except Exception as error:  # datasets raises many types (not found, offline, bad config)
            advice = (
                f"The Hub cannot be reached ({unreachable}): only the datasets cache was read."
                if unreachable
                else "Give a Hub dataset id or an existing local file or folder."
            )
            raise ValueError(
                f"Cannot load dataset {source.path!r} (config {source.config!r}, split {source.read_split!r}): "
                f"{str(error).rstrip('.')}. {advice}"
            ) from error


def _column_texts(source: TextSource, dataset) -> list[str]:
    """The ``text_column`` of the first ``max_documents`` rows (a streamed dataset may not know its columns before
    the first row)."""
    texts: list[str] = []
    for row in dataset:
        if source.text_column not in row:
            raise ValueError(
                f"Dataset {source.path!r} has no column {source.text_column!r}; its columns are {list(row)}. "
                "Choose one with `text_column`."
            )
        if source.max_documents is not None and len(texts) >= source.max_documents:
            break
        text = row[source.text_column]
        if not isinstance(text, str):
            raise ValueError(
                f"Column {source.text_column!r} of dataset {source.path!r} holds {type(text).__name__} values, not "
                f"text; its columns are {list(row)}. Choose the text column with `text_column`."
            )
        texts.append(text)
    return texts


def tokenize_texts(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each document, without special tokens (BOS is the protocol's choice)."""
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def build_windows(
    doc_lengths: list[int],
    length: int,
    protocol: str,
    *,
    bos: bool,
    stride: int | None = None,
    max_windows: int | None = None,
) -> WindowPlan:
    """The windows of ``protocol`` for model inputs of ``length`` positions.

    Args:
        doc_lengths (`list[int]`): token count of each document.
        length (`int`): model input length; with ``bos`` one position is the BOS token.
        protocol (`str`): one of ``sliding``, ``disjoint``, ``truncate`` (see ``PROTOCOL_HELP``).
        bos (`bool`): a BOS token is prepended to every window (then every token of a span is scored).
        stride (`int`, *optional*): step of ``sliding`` windows (only), ``0 < stride <= length``; default half.
        max_windows (`int`, *optional*): keep only the first windows, in document order.

    Documents with fewer tokens than a span are skipped and counted in every protocol.
    """
    check_protocol(protocol, stride)
    span = length - int(bos)
    if span < 2 - int(bos):
        raise ValueError(f"Length {length} is too short to score any token.")
    stride = stride or max(1, length // 2)
    if protocol == "sliding" and not 0 < stride <= span:
        raise ValueError(f"Stride {stride} must be between 1 and the window's {span} text tokens.")
    windows, skipped = [], 0
    for doc, n in enumerate(doc_lengths):
        if max_windows is not None and len(windows) >= max_windows:
            break
        if n < span:
            skipped += 1
        elif protocol == "sliding":
            windows += _sliding(doc, n, span, stride, bos)
        elif protocol == "disjoint":
            windows += [_window(doc, k * span, (k + 1) * span, bos) for k in range(n // span)]
        else:
            windows.append(_window(doc, 0, span, bos))
    windows = windows[:max_windows]
    if not windows:
        raise ValueError(_too_long(doc_lengths, length, span))
    return WindowPlan(windows, skipped, _uncovered(doc_lengths, windows), len({w.doc for w in windows}))


def _uncovered(doc_lengths: list[int], windows: list[Window]) -> int:
    """Tokens of the documents with a window that no window covers (a document's windows come in order)."""
    covered: dict[int, int] = {}
    ends: dict[int, int] = {}
    for w in windows:
        covered[w.doc] = covered.get(w.doc, 0) + max(0, w.end - max(w.start, ends.get(w.doc, 0)))
        ends[w.doc] = max(w.end, ends.get(w.doc, 0))
    return sum(doc_lengths[doc] - count for doc, count in covered.items())


def _too_long(doc_lengths: list[int], length: int, span: int) -> str:
    """Why no window fits; suggests ``join`` only where joining the documents would make one fit."""
    longest, total = max(doc_lengths, default=0), sum(doc_lengths)
    advice = "use shorter `lengths` or other data"
    if len(doc_lengths) > 1 and total >= span:
        advice += f", or `join` to evaluate the documents as one stream ({total} tokens together)"
    return f"Length {length} is longer than every document (the longest has {longest} tokens); {advice}."


def _window(doc: int, start: int, end: int, bos: bool) -> Window:
    return Window(doc, start, end, start if bos else start + 1)


def _sliding(doc: int, n: int, span: int, stride: int, bos: bool) -> list[Window]:
    """The docs recipe: starts every ``stride``; each window scores the tokens after the previous end."""
    windows, prev_end = [], 0
    for start in range(0, n, stride):
        end = min(start + span, n)
        score_from = max(prev_end, start if bos else start + 1)
        if score_from < end:  # with stride == span, a last one-token span has nothing to score
            windows.append(Window(doc, start, end, score_from))
        prev_end = end
        if end == n:
            break
    return windows
