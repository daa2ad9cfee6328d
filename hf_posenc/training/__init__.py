"""Continued pretraining of a patched model (``hf-posenc train``): pack text, choose what trains, run the Trainer.

>>> settings = TrainSettings(length=2048, steps=500, trainable="position")
>>> result = train(model, tokenizer, texts, "alibi-model", settings, "alibi")
>>> model = hf_posenc.from_pretrained("alibi-model")  # patched again, with the trained weights
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._startup import lazy_exports

if TYPE_CHECKING:
    from ..reports.train_summary import TrainSummary
    from .packing import PackedWindows, pack_texts, pack_windows
    from .run import TrainResult, train
    from .settings import TrainSettings
    from .trainable import apply_method, release_gguf, select_trainable

__all__ = [
    "PackedWindows",
    "TrainResult",
    "TrainSettings",
    "TrainSummary",
    "apply_method",
    "pack_texts",
    "pack_windows",
    "release_gguf",
    "select_trainable",
    "train",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "PackedWindows": ".packing",
        "pack_texts": ".packing",
        "pack_windows": ".packing",
        "TrainResult": ".run",
        "train": ".run",
        "TrainSettings": ".settings",
        "TrainSummary": "..reports.train_summary",
        "apply_method": ".trainable",
        "release_gguf": ".trainable",
        "select_trainable": ".trainable",
    },
)
