"""What a fine-tuning run reports, typed: ``train_summary.json``, which :func:`~hf_posenc.training.train` writes
beside the model it saves, and reads back with :meth:`TrainSummary.read`.

The summary is the file field for field: ``to_json`` gives the object the file holds, ``from_json`` reads one.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .schema import known_fields

SUMMARY_FILE = "train_summary.json"


@dataclass(frozen=True)
class TrainData:
    """The windows a run trained on.

    Attributes:
        windows (`int`): how many windows.
        length (`int`): tokens per window.
        bos (`bool`): whether each window began with BOS.
        stream_tokens (`int`): the tokens of the joined documents.
        dropped_tokens (`int`): the tail shorter than a window, not trained on.
        sha256 (`str`): the windows' fingerprint, which a resume compares.
    """

    windows: int
    length: int
    bos: bool
    stream_tokens: int
    dropped_tokens: int
    sha256: str


@dataclass(frozen=True)
class TrainSummary:
    """``train_summary.json``: the method as applied, the settings, the data, the losses, the time, the versions.

    Attributes:
        method (`str`): the registered method name.
        spec (`str`): the method spec as given (``"t5-bias:num_buckets=32"``).
        params (`dict`): its parameters as resolved on the model.
        model (`str`): the model trained, as named.
        sources (`dict`): where the model and texts came from, as the caller said.
        settings (`dict`): the :class:`~hf_posenc.training.TrainSettings` as the run records them.
        data (`TrainData`): the windows trained on.
        trainable_parameters (`int`): values that trained.
        steps (`int`): optimizer steps, all sessions.
        final_loss (`float`): the last logged training loss (NaN, null in the file, where none was).
        losses (`list[tuple[int, float]]`): ``(step, loss)`` of every step.
        seconds (`float`): time spent training, all sessions.
        device (`str`): where it trained.
        bf16 (`bool`): whether in bfloat16 mixed precision.
        world_size (`int`): the processes that trained it.
        versions (`dict`): the versions of the packages that ran.
    """

    method: str
    spec: str
    params: dict[str, Any]
    model: str
    sources: dict[str, Any]
    settings: dict[str, Any]
    data: TrainData
    trainable_parameters: int
    steps: int
    final_loss: float | None
    losses: list[tuple[int, float]]
    seconds: float
    device: str
    bf16: bool
    world_size: int
    versions: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        summary = dataclasses.asdict(self)
        return {**summary, "losses": [list(pair) for pair in self.losses], "seconds": round(self.seconds, 3)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrainSummary:
        losses = [(int(step), loss) for step, loss in data["losses"]]
        return cls(**{**known_fields(cls, data), "data": TrainData(**data["data"]), "losses": losses})

    @classmethod
    def read(cls, path: str | Path) -> TrainSummary:
        """The summary in ``path`` (a ``train_summary.json``, or the folder holding one)."""
        path = Path(path)
        path = path / SUMMARY_FILE if path.is_dir() else path
        try:
            return cls.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path} is no train_summary.json of hf-posenc train: {error}.") from None
