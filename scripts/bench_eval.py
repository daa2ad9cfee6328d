"""Benchmark the evaluation forward: tokens/s against a bare ``model(input_ids)``, and peak memory.

On a GPU (the issue's targets): Llama-7B-shaped random weights in bf16, tokens/s of our forward plus
chunked loss (:func:`hf_posenc.eval.perplexity.window_nll`) against a bare ``model(input_ids)`` at 4k
and 32k, and peak memory of one 128k-token window (ours, and transformers' ``labels=`` loss)::

    python scripts/bench_eval.py                   # writes benchmarks/results/eval_<gpu>_<date>.json
    python scripts/bench_eval.py --tiny            # CPU smoke check of this script; prints, writes nothing

Every number in the JSON is measured by this script on the machine it names.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import SHAPES  # noqa: E402

from hf_posenc.eval.data import parse_lengths  # noqa: E402
from hf_posenc.eval.perplexity import window_nll  # noqa: E402
from hf_posenc.eval.results import versions  # noqa: E402

GIB = 2**30


def build_model(shape: dict, dtype: torch.dtype, device: torch.device):
    """Random weights (seeded) in ``dtype`` on ``device``, SDPA attention, eval mode."""
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(LlamaConfig(**shape), dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def seconds(fn, device: torch.device, repeats: int) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def throughput(model, length: int, device: torch.device, repeats: int, chunk_size: int) -> dict:
    ids = torch.randint(0, model.config.vocab_size, (1, length), device=device)

    @torch.inference_mode()
    def bare():
        model(input_ids=ids, use_cache=False)

    def ours():
        window_nll(model, ids, 1, chunk_size)

    bare_s, ours_s = seconds(bare, device, repeats), seconds(ours, device, repeats)
    return {
        "length": length,
        "bare_forward_tokens_per_s": length / bare_s,
        "eval_tokens_per_s": length / ours_s,
        "ratio": bare_s / ours_s,
    }


def peak_memory(model, length: int, device: torch.device, chunk_size: int, labels: bool) -> dict:
    """Peak allocated GiB of one window (ours, and optionally transformers' ``labels=`` loss)."""
    ids = torch.randint(0, model.config.vocab_size, (1, length), device=device)
    result = {"length": length}
    runs = {"eval_peak_gib": lambda: window_nll(model, ids, 1, chunk_size)}
    if labels:
        runs["labels_loss_peak_gib"] = lambda: model(input_ids=ids, labels=ids, use_cache=False)
    for key, fn in runs.items():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        try:
            with torch.inference_mode():
                fn()
            result[key] = torch.cuda.max_memory_allocated() / GIB
        except torch.OutOfMemoryError:
            result[key] = "out of memory"
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny model on CPU: a smoke check, writes nothing")
    parser.add_argument("--lengths", type=parse_lengths, help="throughput lengths (default: 4k,32k; tiny: 256)")
    parser.add_argument("--peak-length", type=parse_lengths, help="peak-memory length (default: 128k)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk-size", type=int, default=2048)
    parser.add_argument("--no-labels", action="store_true", help="skip the labels= peak-memory comparison")
    parser.add_argument("--output", type=Path, help="JSON path (default: benchmarks/results/eval_<device>_<date>.json)")
    args = parser.parse_args(argv)

    cuda = torch.cuda.is_available() and not args.tiny
    if not cuda and not args.tiny:
        parser.error("no CUDA device: the benchmark targets a GPU; use --tiny for a CPU smoke check")
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    model = build_model(SHAPES["tiny" if args.tiny else "llama-7b"], dtype, device)
    lengths = args.lengths or ([256] if args.tiny else [4096, 32768])
    record = {
        "benchmark": "hf_posenc eval forward + chunked loss vs bare model(input_ids)",
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "model": {"shape": "tiny" if args.tiny else "Llama-7B", **model.config.to_diff_dict(), "dtype": str(dtype)},
        "chunk_size": args.chunk_size,
        "versions": versions(),
        "throughput": [throughput(model, n, device, args.repeats, args.chunk_size) for n in lengths],
    }
    if cuda:
        peak = (args.peak_length or [131072])[0]
        record["peak_memory"] = peak_memory(model, peak, device, args.chunk_size, labels=not args.no_labels)
    print(json.dumps(record, indent=2))
    if not args.tiny:
        day = datetime.now(timezone.utc).strftime("%Y%m%d")
        name = re.sub(r"[^A-Za-z0-9]+", "-", record["device"]).strip("-").lower()
        path = args.output or Path("benchmarks/results") / f"eval_{name}_{day}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
