"""Continued pretraining of a patched model (``hf-posenc train``): pack text, choose what trains, run the Trainer.

>>> settings = TrainSettings(length=2048, steps=500, trainable="position")
>>> result = train(model, tokenizer, texts, "alibi-model", settings, "alibi")
>>> model = hf_posenc.from_pretrained("alibi-model")  # patched again, with the trained weights
"""

from __future__ import annotations

from .packing import PackedWindows, pack_texts, pack_windows
from .run import TrainResult, TrainSettings, train
from .trainable import apply_method, release_gguf, select_trainable

__all__ = [
    "PackedWindows",
    "TrainResult",
    "TrainSettings",
    "apply_method",
    "pack_texts",
    "pack_windows",
    "release_gguf",
    "select_trainable",
    "train",
]
