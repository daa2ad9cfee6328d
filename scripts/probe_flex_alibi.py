"""Why is the flex ALiBi backend slower than causal SDPA on a GPU? One attention call (B=1, H=32, D=128, bf16) at
16k and 32k tokens: the library's flex backend against ``flex_attention`` compiled by hand for fixed or
dynamic shapes, with or without the ALiBi score_mod, and with Triton kernel options; then a profile of the
cudnn backend against cuDNN's fused ALiBi called directly at 4k (where launch overhead shows). Prints speed
as a fraction of causal SDPA's and writes the medians (ms, ``triton.testing.do_bench``) as JSON.

    python scripts/probe_flex_alibi.py --output benchmarks/results/flex_probe_h100.json   # CUDA only

Each fixed-shape variant is a new compilation of the same code, so after dynamo's recompile limit (8) the
rest of a run falls back to uncompiled flex and runs out of memory: those show as errors in the output.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_alibi  # noqa: E402

from hf_posenc.methods import alibi_slopes  # noqa: E402

HEADS, DIM = 32, 128
KERNEL_OPTIONS = {
    "tma": {"USE_TMA": True},
    "b128x128w8": {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2},
    "b128x64w8s3": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},
}


def flex_variants(length: int, device: torch.device) -> dict:
    slopes = alibi_slopes(HEADS, dtype=torch.float32).to(device)
    static, dynamic = torch.compile(flex_attention, dynamic=False), torch.compile(flex_attention, dynamic=True)
    q, k, v = (torch.randn(1, HEADS, length, DIM, device=device, dtype=torch.bfloat16) for _ in range(3))
    block_mask = create_block_mask(lambda b, h, i, j: i >= j, 1, None, length, length, device=device)

    def score_mod(score, batch, head, i, j):
        return score - slopes[head] * (i - j)

    library = bench_alibi.alibi_call("alibi_flex", q, k, v, device, HEADS)
    variants = {
        "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
        "library_flex": lambda: library(q, k, v),
        "static_smod": lambda: static(q, k, v, score_mod=score_mod, block_mask=block_mask),
        "dynamic_smod": lambda: dynamic(q, k, v, score_mod=score_mod, block_mask=block_mask),
        "static_nosmod": lambda: static(q, k, v, block_mask=block_mask),
    }
    for name, options in KERNEL_OPTIONS.items():
        variants[f"static_smod_{name}"] = lambda options=options: static(
            q, k, v, score_mod=score_mod, block_mask=block_mask, kernel_options=options
        )
    return variants


def median_ms(run) -> float | str:
    try:
        with torch.no_grad():
            return do_bench(run, warmup=50, rep=300, return_mode="median")
    except Exception as error:  # a variant that cannot run is a result here
        return f"{type(error).__name__}: {str(error)[:200]}"


def profile_cudnn(length: int, device: torch.device) -> None:
    shapes = argparse.Namespace(batch=1, heads=HEADS, head_dim=DIM, dtype="bfloat16")
    for backward in (False, True):
        q, k, v = bench_alibi.make_inputs(length, shapes, device, grad=backward)
        ours = bench_alibi.timed(bench_alibi.alibi_call("alibi_cudnn", q, k, v, device, HEADS), q, k, v, backward)
        for name, run in (("ours", ours), ("direct", bench_alibi.cudnn_direct(q, k, v, backward))):
            for _ in range(5):
                run()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as trace:
                for _ in range(10):
                    run()
                torch.cuda.synchronize()
            print(f"=== {name} n={length} backward={backward}")
            print(trace.key_averages().table(sort_by="self_cuda_time_total", row_limit=8, max_name_column_width=60))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    device, results = torch.device("cuda"), {}
    for length in (16384, 32768):
        results[length] = {name: median_ms(run) for name, run in flex_variants(length, device).items()}
        sdpa = results[length]["sdpa"]
        print(length, {k: round(sdpa / v, 3) if isinstance(v, float) else v for k, v in results[length].items()})
    profile_cudnn(4096, device)
    args.output.write_text(json.dumps({"environment": bench_alibi.environment(device), "ms": results}, indent=1))


if __name__ == "__main__":
    main()
