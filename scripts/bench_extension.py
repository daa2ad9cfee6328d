"""What do Self-Extend, DCA and log-n cost in attention? One attention call (prefill, causal, B=1) of each
method's backend against causal SDPA without any bias on the same q, k, v, in the same process.

Targets (issue 13, on an H100, H=32, D=128, bf16, 32k and 128k): >= 0.5x causal SDPA for Self-Extend and DCA
(two or three segments: their published kernels pay about two attention passes), >= 0.95x for log-n; memory
linear in n. GPU run:
    python scripts/bench_extension.py --device cuda --dtype bfloat16 --lengths 32k,128k
With --profile DIR, one more call of each under torch.profiler: DIR/<length>_<variant>.txt.
CPU (the offline model's shape, SmolLM2-135M: 9 heads, 3 key/value heads, D=64; --backend blocked for the other):
    python scripts/bench_extension.py --device cpu --dtype float32 --heads 9 --kv-heads 3 --head-dim 64 \
        --lengths 4k,8k --context 8192
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.profiler import ProfilerActivity
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import environment, synchronize, time_rounds, write_json  # noqa: E402

import hf_posenc  # noqa: E402, F401  (registers the attention functions)
from hf_posenc.attention import EXTENSION_FUNCTIONS, TEMPERATURE_FUNCTIONS  # noqa: E402
from hf_posenc.attention.extension import ExtensionState, extension_mask  # noqa: E402
from hf_posenc.eval.data import parse_lengths  # noqa: E402
from hf_posenc.registry import get_method  # noqa: E402

METHODS = {
    "self-extend": {"group_size": 8},
    "dca": {},
    "logn": {},
}


def fake_module(heads: int, kv_heads: int, state: ExtensionState) -> SimpleNamespace:
    """What the attention functions read from an attention module (layer 1: no position_ids check)."""
    return SimpleNamespace(
        hf_posenc_extension=state,
        training=False,
        is_causal=True,
        layer_idx=1,
        num_key_value_groups=heads // kv_heads,
    )


def run_length(args: argparse.Namespace, length: int, device: torch.device, dtype: torch.dtype) -> dict:
    generator = torch.Generator(device).manual_seed(0)

    def states(n_heads: int) -> torch.Tensor:
        return torch.randn(1, n_heads, length, args.head_dim, generator=generator, device=device, dtype=dtype)

    query, key, value = states(args.heads), states(args.kv_heads), states(args.kv_heads)
    rotary = SimpleNamespace(inv_freq=1.0 / 10000 ** (torch.arange(0, args.head_dim, 2, device=device) / args.head_dim))
    mask = extension_mask(batch_size=1, q_length=length, kv_length=length, device=device)
    position_ids = torch.arange(length, device=device)[None]
    scale = args.head_dim**-0.5
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    plain = fake_module(args.heads, args.kv_heads, None)
    variants = {"sdpa": lambda: sdpa(plain, query, key, value, None, scaling=scale, is_causal=True)}
    backend = args.backend
    for name, params in METHODS.items():
        resolved = get_method(name).make_params(original_max_position_embeddings=args.context, **params)
        remap = resolved if get_method(name).role == "remap" else None
        temperature = resolved if remap is None else None
        module = fake_module(args.heads, args.kv_heads, ExtensionState(remap, temperature, rotary, args.head_dim))
        if remap is None:
            function = TEMPERATURE_FUNCTIONS["sdpa"]
            variants[name] = lambda f=function, m=module: f(
                m, query, key, value, None, scaling=scale, is_causal=True, position_ids=position_ids
            )
        else:
            function = EXTENSION_FUNCTIONS[backend]
            variants[name] = lambda f=function, m=module: f(m, query, key, value, mask, scaling=scale)
    with torch.inference_mode():
        seconds = time_rounds(variants, device, args.repeats)
        if args.profile is not None:
            profile(variants, device, args.profile / f"{length}")
    return {
        "length": length,
        "backend": backend,
        "seconds": seconds,
        "ratio_vs_sdpa": {name: seconds["sdpa"] / value for name, value in seconds.items() if name != "sdpa"},
    }


def profile(variants: dict[str, Callable[[], object]], device: torch.device, prefix: Path) -> None:
    """One more call of each variant under ``torch.profiler``: its operators and kernels by device time, in
    ``<prefix>_<variant>.txt`` (where the time beyond the attention kernel goes)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for name, run in variants.items():
        synchronize(device)
        with torch.profiler.profile(activities=activities) as profiler:
            run()
            synchronize(device)
        table = profiler.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=90)
        Path(f"{prefix}_{name}.txt").write_text(table + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--lengths", default="32k,128k")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--context", type=int, default=8192, help="trained context L the methods are set for")
    parser.add_argument(
        "--backend", default="flex", choices=["flex", "blocked", "sdpa", "eager"], help="remaps' backend"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=None, help="results JSON (default: print only)")
    parser.add_argument(
        "--profile", type=Path, default=None, help="folder: also write a torch.profiler table of each call"
    )
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    rows = []
    for length in parse_lengths(args.lengths):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        row = run_length(args, length, device, dtype)
        if device.type == "cuda":
            row["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        print(row, flush=True)
        rows.append(row)
    result = {"environment": environment(device), "arguments": vars(args) | {"output": str(args.output)}, "rows": rows}
    if args.output is not None:
        write_json(args.output, result)


if __name__ == "__main__":
    main()
