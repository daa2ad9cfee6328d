"""Peak memory and speed of a long window's scoring forward, the MLPs and norms over slices of the sequence against
one call, in the same process: the eval's own path (``cumulative_nll``), random weights.

    python scripts/bench_position_wise.py --device cpu --shape mlp-heavy --length 16384 \
        --output benchmarks/results/position_wise_cpu.json
    python scripts/bench_position_wise.py --device cuda --shape llama-7b --dtype bfloat16 --length 131072 \
        --fit-lengths 65536,131072 --output "$OUT/position_wise_h100.json"

The peak is the high-water mark during the forward: on CUDA, ``torch.cuda.max_memory_allocated``; on CPU, the
process's resident high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs``) — both absolute and above
what was held before the forward (weights and inputs). Both variants run the same attention kernel (``sdpa``), so
the ratio compares the position-wise layers alone. ``--fit-lengths``: peaks at two lengths, and the longest window
under the device's memory by the line through them (memory is linear in the length for both variants).
"""

from __future__ import annotations

import argparse
import gc
import re
from pathlib import Path

import torch
from bench_common import SHAPES, environment, time_rounds, write_json
from transformers import AutoModelForCausalLM, LlamaConfig

from hf_posenc.eval.defaults import DEFAULT_SEQUENCE_SLICE
from hf_posenc.eval.perplexity import cumulative_nll
from hf_posenc.eval.position_wise import sequence_slices

# a shape whose MLP holds the peak on a CPU: width 16x the hidden size, two layers
MLP_HEAVY = dict(
    hidden_size=512,
    intermediate_size=8192,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=8,
    vocab_size=1000,
    max_position_embeddings=4096,
)


def _model(shape: str, dtype: torch.dtype, device: torch.device):
    config = LlamaConfig(**(MLP_HEAVY if shape == "mlp-heavy" else SHAPES[shape]))
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def _status_bytes(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE).group(1)) * 1024


def _peak(run, device: torch.device) -> tuple[int, int]:
    """``(absolute peak, peak above the start)`` in bytes of ``run()``."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        run()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
    else:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident size
        start = _status_bytes("VmRSS")
        run()
        peak = _status_bytes("VmHWM")
    return peak, peak - start


def _variants(model, ids: torch.Tensor, size: int) -> dict:
    def one_call():
        return cumulative_nll(model, ids, 1)

    def sliced():
        with sequence_slices(model, size):
            return cumulative_nll(model, ids, 1)

    return {"one call": one_call, f"slices of {size}": sliced}


def _measure(model, length: int, size: int, device: torch.device, repeats: int) -> dict:
    ids = torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(1))
    variants = _variants(model, ids.to(device), size)
    outputs = {name: run().cpu() for name, run in variants.items()}
    first, second = outputs.values()
    peaks = {name: _peak(run, device) for name, run in variants.items()}
    seconds = time_rounds(variants, device, repeats) if repeats else {}
    gib = 2**30
    rows = {
        name: {
            "peak_gib": round(peaks[name][0] / gib, 3),
            "peak_above_start_gib": round(peaks[name][1] / gib, 3),
            **(
                {"seconds": round(seconds[name], 3), "tokens_per_s": round(length / seconds[name], 1)}
                if seconds
                else {}
            ),
        }
        for name in variants
    }
    bare, cut = (peaks[name][1] for name in variants)
    return {
        "length": length,
        "variants": rows,
        "nll_equal_bitwise": bool(torch.equal(first, second)),
        "nll_max_abs_difference": float((first - second).abs().max()),
        "peak_above_start_ratio": round(cut / bare, 3),
        **({"speed_ratio": round(seconds[next(iter(variants))] / seconds[list(variants)[1]], 3)} if seconds else {}),
    }


def _longest(points: list[dict], variant: str, capacity: int) -> int:
    """The length at which the line through two (length, absolute peak) points reaches ``capacity`` bytes."""
    (n0, p0), (n1, p1) = ((p["length"], p["variants"][variant]["peak_gib"] * 2**30) for p in points)
    slope = (p1 - p0) / (n1 - n0)
    return int(n0 + (capacity - p0) / slope)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", choices=["mlp-heavy", *SHAPES], default="mlp-heavy")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--slice", type=int, default=DEFAULT_SEQUENCE_SLICE)
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (0: peaks only)")
    parser.add_argument("--fit-lengths", help="two lengths: peaks at each, and the longest window that fits")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device(args.device)
    model = _model(args.shape, getattr(torch, args.dtype), device)
    result = {**environment(device), "shape": args.shape, "dtype": args.dtype, "attention": "sdpa"}
    result["kernels"] = "the same attention (sdpa) and output head on both sides; only the MLP and norm calls differ"
    result["main"] = _measure(model, args.length, args.slice, device, args.repeats)
    print(result["main"])
    if args.fit_lengths and device.type == "cuda":
        points = [_measure(model, int(n), args.slice, device, 0) for n in args.fit_lengths.split(",")]
        capacity = torch.cuda.get_device_properties(device).total_memory
        result["fit"] = {
            "points": points,
            "capacity_gib": round(capacity / 2**30, 2),
            "longest_by_line": {name: _longest(points, name, capacity) for name in points[0]["variants"]},
            "how": "extrapolated: the line through the absolute peaks at the two lengths, not a forward at that length",
        }
        print(result["fit"]["longest_by_line"])
    write_json(args.output, result)


if __name__ == "__main__":
    main()
