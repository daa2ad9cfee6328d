"""What a perplexity or passkey run reports, typed: the values :func:`~hf_posenc.eval.run_perplexity` and
:func:`~hf_posenc.eval.run_passkey` return, and their files read back.

Each report is the JSON file its run writes (``results.json``, ``passkey.json``), field for field: ``to_json``
gives that object, ``from_json`` reads one (a field a file lacks, one made by hand or by another program, is None
or empty), and ``read`` a file, checked first (:func:`~hf_posenc.reports.schema.read_report`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .schema import known_fields, read_report


@dataclass(frozen=True)
class PerplexityRow:
    """One method at one length: token-weighted NLL and perplexity, what was (not) scored, and how.

    Attributes:
        method (`str`): the method spec (``"yarn:factor=4"``; ``"none"``: unpatched).
        params (`dict`): its parameters as resolved on the model.
        length (`int`): the window length, in tokens.
        ppl (`float`): ``exp(nll)``; ``inf`` past the float range, NaN for a numerical failure.
        nll (`float`): the mean negative log-likelihood per scored token.
        tokens (`int`): the tokens scored.
        windows (`int`, *optional*): the windows scored.
        documents (`int`, *optional*): the documents they came from.
        skipped_documents (`int`, *optional*): the documents shorter than a window, skipped.
        dropped_tokens (`int`, *optional*): the tokens no window held.
        forwards (`int`, *optional*): the windows with a forward of their own; the others were read from the
            forwards at ``derived_from`` tokens.
        derived_from (`int`, *optional*): see ``forwards``.
        seconds (`float`, *optional*): the time the length took.
        blocks (`list`, *optional*): ``[summed NLL, tokens]`` of contiguous blocks of each window's tokens, window
            after window (a run's ``blocks`` option; a file holds null for a sum that is not finite).
    """

    method: str
    length: int
    ppl: float
    nll: float
    tokens: int
    params: dict[str, Any] = field(default_factory=dict)
    windows: int | None = None
    documents: int | None = None
    skipped_documents: int | None = None
    dropped_tokens: int | None = None
    forwards: int | None = None
    derived_from: int | None = None
    seconds: float | None = None
    blocks: list[list[float | int | None]] | None = None

    def to_json(self) -> dict[str, Any]:
        """The row as ``results.json`` holds it (its values; a file marks a non-finite one, ``status``)."""
        row = dataclasses.asdict(self)
        if row["blocks"] is None:  # a run without blocks: no such field
            del row["blocks"]
        return {"method": row.pop("method"), "params": row.pop("params"), **row}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> PerplexityRow:
        return cls(**known_fields(cls, row))


@dataclass(frozen=True)
class PerplexityReport:
    """``hf-posenc eval``'s ``results.json``: every method at every length, on the same windows.

    Attributes:
        protocol (`str`): ``truncate``, ``disjoint`` or ``sliding``.
        model (`str`): the model, as labelled.
        dataset (`str`): the documents, as labelled.
        results (`tuple[PerplexityRow]`): the rows, by method then length.
        protocol_details (`dict`): BOS, the stride and the mean.
        model_details (`dict`): the model as loaded: dtype, trained context, fingerprint, commit.
        dataset_details (`dict`): the documents: count, tokens, hashes.
        versions (`dict`): the versions of the packages that ran.
        device (`str`, *optional*): where it ran.
        processes (`int`, *optional*): how many processes ran it.
        arguments (`dict`): the inputs that decide its numbers, which a resume compares.
    """

    protocol: str
    model: str
    dataset: str
    results: tuple[PerplexityRow, ...]
    protocol_details: dict[str, Any] = field(default_factory=dict)
    model_details: dict[str, Any] = field(default_factory=dict)
    dataset_details: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    device: str | None = None
    processes: int | None = None
    arguments: dict[str, Any] = field(default_factory=dict)

    def ppl(self, method: str, length: int) -> float | None:
        """The perplexity of ``method`` at ``length``, or None where the report has no such row."""
        return next((row.ppl for row in self.results if (row.method, row.length) == (method, length)), None)

    def to_json(self) -> dict[str, Any]:
        report = {item.name: getattr(self, item.name) for item in dataclasses.fields(self)}
        return {**report, "results": [row.to_json() for row in self.results]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PerplexityReport:
        rows = tuple(PerplexityRow.from_json(row) for row in data["results"])
        return cls(**{**known_fields(cls, data), "results": rows})

    @classmethod
    def read(cls, path: str | Path) -> PerplexityReport:
        """The report in ``path`` (a ``results.json``); ``ValueError`` naming the file and field where malformed."""
        return cls.from_json(read_report(Path(path), kind="perplexity", advice="it is no results.json of eval"))


@dataclass(frozen=True)
class PasskeyTrial:
    """One prompt: ``key`` hidden at ``depth`` (0: start, 1: end) of a ``length``-token prompt; ``correct``: the
    model, teacher-forced, gives the key's tokens and then no further digit."""

    method: str
    length: int
    depth: float
    correct: bool
    key: int | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PasskeyCell:
    """The accuracy of ``method`` at one length and depth, over its ``trials`` keys."""

    method: str
    length: int
    depth: float
    accuracy: float
    trials: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PasskeyReport:
    """``hf-posenc passkey``'s ``passkey.json``: every trial, and the accuracy by method, length and depth.

    Attributes:
        model (`str`): the model, as labelled.
        trials (`tuple[PasskeyTrial]`): every prompt and whether the model gave its key.
        accuracy (`tuple[PasskeyCell]`): the accuracy by method, length and depth.
        task (`str`, *optional*): how a trial is scored.
        bos (`bool`, *optional*): whether the prompts began with BOS.
        model_details (`dict`): the model as loaded.
        versions (`dict`): the versions of the packages that ran.
        device (`str`, *optional*): where it ran.
        processes (`int`, *optional*): how many processes ran it.
        arguments (`dict`): the inputs a resume compares.
        prompt_hashes (`dict`): each length's prompts, hashed, which a resume compares.
    """

    model: str
    trials: tuple[PasskeyTrial, ...]
    accuracy: tuple[PasskeyCell, ...]
    task: str | None = None
    bos: bool | None = None
    model_details: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    device: str | None = None
    processes: int | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    prompt_hashes: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        report = {item.name: getattr(self, item.name) for item in dataclasses.fields(self)}
        trials, cells = [trial.to_json() for trial in self.trials], [cell.to_json() for cell in self.accuracy]
        return {**report, "trials": trials, "accuracy": cells}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PasskeyReport:
        trials = tuple(PasskeyTrial(**known_fields(PasskeyTrial, trial)) for trial in data["trials"])
        cells = tuple(PasskeyCell(**known_fields(PasskeyCell, cell)) for cell in data["accuracy"])
        return cls(**{**known_fields(cls, data), "trials": trials, "accuracy": cells})

    @classmethod
    def read(cls, path: str | Path) -> PasskeyReport:
        """The report in ``path`` (a ``passkey.json``); ``ValueError`` naming the file and field where malformed."""
        return cls.from_json(read_report(Path(path), kind="passkey", advice="it is no passkey.json of passkey"))
