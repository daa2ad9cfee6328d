"""Shared pieces of the benchmark scripts: environment record, timing, model shapes, JSON output."""

from __future__ import annotations

import datetime as _dt
import json
import platform
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path, PurePath

import torch
import transformers

from hf_posenc.attention import cudnn
from hf_posenc.eval.results import device_description
from hf_posenc.files import atomic_write_text

# Llama-2-7B's shape (random weights) and a tiny one for a CPU smoke run.
SHAPES = {
    "llama-7b": dict(
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
        max_position_embeddings=4096,
    ),
    "tiny": dict(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=1000,
        max_position_embeddings=1024,
    ),
}


def environment(device: torch.device) -> dict:
    """Device, versions and date, for the results JSON."""
    return {
        "device": device_description(device),
        "device_type": device.type,
        "cpu_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        **({"cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()} if device.type == "cuda" else {}),
        **({"cudnn_frontend": cudnn.cudnn.__version__} if cudnn.installed() else {}),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_rounds(
    variants: dict[str, Callable[[], object]],
    device: torch.device,
    repeats: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Median seconds per call of each variant, measured in interleaved rounds in a shuffled order
    (drift and the position within a round hit all variants alike)."""
    for run in variants.values():  # warm-up
        run()
    times: dict[str, list[float]] = {name: [] for name in variants}
    order = random.Random(0)
    for _ in range(repeats):
        for name in order.sample(list(variants), len(variants)):
            run = variants[name]
            synchronize(device)
            start = clock()
            run()
            synchronize(device)
            times[name].append(clock() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def _path_as_text(value: object) -> str:
    """Paths among a script's arguments (``--output``, ``--profile``) as text; anything else is not JSON."""
    if isinstance(value, PurePath):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def write_json(path: Path, payload: dict) -> None:
    """``payload`` as JSON at ``path``, replaced whole (a run cut by its timeout mid-write keeps the file before)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(payload, indent=2, default=_path_as_text) + "\n")
    print(f"wrote {path}")
