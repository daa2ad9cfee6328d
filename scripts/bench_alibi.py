"""ALiBi attention speed against causal SDPA without bias, in one run: forward and forward+backward.

Attention alone (B=1, H=32, D=128 by default, causal), the way a patched model calls it: our backend
function with the mask its mask function builds (built once per forward, outside the timing, as the
model builds it once for all layers). Variants:

* ``sdpa_causal``: ``scaled_dot_product_attention(is_causal=True)`` without bias, cuDNN backend on CUDA
  (the target's reference);
* ``alibi_flex``: hf_posenc's flex backend (compiled ``flex_attention`` + ALiBi score_mod, O(n) memory);
* ``alibi_cudnn``: hf_posenc's cudnn backend (cuDNN frontend's fused ALiBi; needs ``nvidia-cudnn-frontend``);
* ``alibi_sdpa``: hf_posenc's sdpa backend (an n x n bias per call), only up to ``--sdpa-max``;
* ``cudnn_direct``: NVIDIA's fused ALiBi called directly (CUDA): the same cuDNN graphs planned once, executed on
  buffers and a workspace allocated once, no autograd, no mask function: the floor of the ``cudnn`` backend.

Before timing, each ALiBi backend is checked against the eager reference at a small length. Reports
median ms, TFLOP/s (causal: forward 2·B·H·n²·D, backward 2.5x that) and peak memory, as JSON.

On an H100:
    python scripts/bench_alibi.py --lengths 4096,16384,32768,131072 --out benchmarks/results/alibi_h100.json
CPU smoke run (flex uncompiled, no cuDNN):
    python scripts/bench_alibi.py --device cpu --dtype float32 --heads 4 --lengths 256,512 --repeats 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import environment, time_rounds, write_json  # noqa: E402

from hf_posenc.attention import cudnn  # noqa: E402
from hf_posenc.attention.functions import (  # noqa: E402
    alibi_cudnn_attention,
    alibi_flex_attention,
    alibi_sdpa_attention,
    cudnn_self_check,
    paper_alibi_attention,
)
from hf_posenc.attention.masks import alibi_distance_mask, alibi_flex_mask, alibi_prefill_mask  # noqa: E402
from hf_posenc.methods import alibi_slopes  # noqa: E402

BACKENDS = {
    "alibi_flex": (alibi_flex_attention, alibi_flex_mask),
    "alibi_sdpa": (alibi_sdpa_attention, alibi_distance_mask),
}
if cudnn.installed():
    BACKENDS["alibi_cudnn"] = (alibi_cudnn_attention, alibi_prefill_mask)


def make_inputs(length: int, args: argparse.Namespace, device: torch.device, grad: bool):
    dtype = getattr(torch, args.dtype)
    generator = torch.Generator(device).manual_seed(length)
    shape = (args.batch, args.heads, length, args.head_dim)  # (B, H, T, D)
    return [torch.randn(shape, generator=generator, device=device, dtype=dtype).requires_grad_(grad) for _ in range(3)]


def module_stub(heads: int) -> SimpleNamespace:
    """What the attention functions read from the attention module: the paper's slopes, and training off."""
    return SimpleNamespace(
        alibi_slopes=alibi_slopes(heads, dtype=torch.float32), alibi_paper_slopes=True, training=False
    )


def causal_sdpa(q, k, v, device: torch.device):
    backends = [SDPBackend.CUDNN_ATTENTION] if device.type == "cuda" else [SDPBackend.MATH]
    with sdpa_kernel(backends):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def alibi_call(name: str, q, k, v, device: torch.device, heads: int):
    attention, mask_function = BACKENDS[name]
    batch, length = q.shape[0], q.shape[2]
    mask = mask_function(batch_size=batch, q_length=length, kv_length=length, device=device)
    module = module_stub(heads)
    return lambda q, k, v: attention(module, q, k, v, mask, scaling=q.shape[-1] ** -0.5)[0]


def fused(q, k, v, scale: float, backward: bool) -> bool:
    """Whether the cudnn backend ran cuDNN's fused kernel for these inputs (else it ran flex)."""
    return cudnn_self_check(q.device, q.shape[1], k.shape[1], q.shape[3]) is None and cudnn.prepare(
        q, k, v, scale, training=backward
    )


def cudnn_direct(q, k, v, backward: bool, calls: int = 1):
    """One call of cuDNN's fused ALiBi graph(s), everything but the kernels done beforehand."""
    frontend = cudnn.cudnn
    handle = frontend.create_handle()
    frontend.set_stream(handle=handle, stream=torch.cuda.current_stream(q.device).cuda_stream)
    q, k, v, scale = q.detach(), k.detach(), v.detach(), q.shape[-1] ** -0.5
    graphs, packs = [cudnn.forward_graph(q, k, v, scale, training=backward, handle=handle)], []
    output, stats = cudnn.new_output(q), torch.empty(*q.shape[:3], 1, dtype=torch.float32, device=q.device)
    packs.append({graphs[0].q: q, graphs[0].k: k, graphs[0].v: v, graphs[0].o: output})
    if backward:
        packs[0][graphs[0].stats] = stats
        grad_output = torch.randn_like(output)
        graph = cudnn.backward_graph(q, k, v, output, grad_output, stats, scale, handle=handle)
        tensors = (q, k, v, output, grad_output, stats, *(torch.empty_like(t) for t in (q, k, v)))
        handles = (graph.q, graph.k, graph.v, graph.o, graph.d_o, graph.stats, graph.dq, graph.dk, graph.dv)
        graphs.append(graph)
        packs.append(dict(zip(handles, tensors, strict=True)))
    workspaces = []
    for built in graphs:
        built.graph.build_operation_graph()
        built.graph.create_execution_plans([frontend.heur_mode.A, frontend.heur_mode.FALLBACK])
        built.graph.check_support()
        built.graph.build_plans()
        workspaces.append(torch.empty(built.graph.get_workspace_size(), dtype=torch.uint8, device=q.device))

    def run():
        for _ in range(calls):
            for built, pack, workspace in zip(graphs, packs, workspaces, strict=True):
                built.graph.execute(pack, workspace, handle=handle)

    return run


def check_against_eager(args: argparse.Namespace, device: torch.device) -> dict[str, float]:
    """Max |difference| of each backend against the eager reference (float32 math) at 1024 tokens."""
    q, k, v = make_inputs(1024, args, device, grad=False)
    reference = paper_alibi_attention(q, k, v, args.head_dim**-0.5).float()
    errors = {}
    for name in BACKENDS:
        with torch.no_grad():
            out = alibi_call(name, q, k, v, device, args.heads)(q, k, v)
        errors[name] = (out.float() - reference).abs().max().item()
    return errors


def timed(run, q, k, v, backward: bool, calls: int = 1):
    """One timed unit: ``calls`` calls back to back (the next one queued while the last runs, as a model's layers
    are), so that launch overhead counts as it does in a forward rather than once per synchronisation."""
    if not backward:

        def forward():
            with torch.no_grad():
                for _ in range(calls):
                    run(q, k, v)

        return forward
    grad = torch.randn_like(q).transpose(1, 2)  # outputs are (B, T, H, D) from our functions

    def forward_backward():
        for _ in range(calls):
            out = run(q, k, v)
            out = out if out.shape == grad.shape else out.transpose(1, 2)
            out.backward(grad)
            q.grad = k.grad = v.grad = None

    return forward_backward


def peak_gib(run, device: torch.device) -> float | None:
    """Peak memory of one call (GiB), the inputs included; None off CUDA."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    run()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) / 2**30


def bench(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    results = []
    for length in args.lengths:
        for backward in (False, True):
            q, k, v = make_inputs(length, args, device, grad=backward)
            calls = max(1, min(16, (16384 // length) ** 2))  # short calls: many per timed unit
            sdpa = timed(lambda q, k, v: causal_sdpa(q, k, v, device), q, k, v, backward, calls)
            variants = {"sdpa_causal": sdpa}
            for name in BACKENDS:
                if name == "alibi_sdpa" and length > args.sdpa_max:
                    continue
                if name in ("alibi_flex", "alibi_cudnn") and backward and device.type != "cuda":
                    continue  # flex_attention has no backward on CPU; cudnn falls back to flex there
                variants[name] = timed(alibi_call(name, q, k, v, device, args.heads), q, k, v, backward, calls)
            if "alibi_cudnn" in BACKENDS and device.type == "cuda":
                variants["cudnn_direct"] = cudnn_direct(q, k, v, backward, calls)
            flops = 2 * args.batch * args.heads * length**2 * args.head_dim * (3.5 if backward else 1.0)
            seconds = time_rounds(variants, device, args.repeats)  # interleaved: drift hits every variant alike
            for name, run in variants.items():
                peak = peak_gib(run, device)
                row = {
                    "length": length,
                    "pass": "forward+backward" if backward else "forward",
                    "variant": name,
                    "calls_per_timing": calls,
                    "ms": seconds[name] / calls * 1e3,
                    "tflops": flops * calls / seconds[name] / 1e12,
                    "peak_gib": peak,
                    **({"fused": fused(q, k, v, args.head_dim**-0.5, backward)} if name == "alibi_cudnn" else {}),
                }
                results.append(row)
                print(row, flush=True)
    for row in results:
        base = next(
            r
            for r in results
            if r["length"] == row["length"] and r["pass"] == row["pass"] and r["variant"] == "sdpa_causal"
        )
        row["vs_sdpa_causal"] = base["ms"] / row["ms"]
        if row["variant"] == "alibi_cudnn":
            direct = [r for r in results if r["variant"] == "cudnn_direct" and r["length"] == row["length"]]
            direct = [r for r in direct if r["pass"] == row["pass"]]
            if direct:
                row["vs_cudnn_direct"] = direct[0]["ms"] / row["ms"]
    return {
        "benchmark": "alibi_attention",
        "args": vars(args),
        "environment": environment(device),
        "max_abs_error_vs_eager_at_1024": check_against_eager(args, device),
        "results": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[4096, 16384, 32768, 131072]
    )
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--sdpa-max", type=int, default=16384, help="longest length for the n x n-bias sdpa backend")
    parser.add_argument("--out", type=Path, default=None, help="results JSON (printed only when omitted)")
    args = parser.parse_args()
    payload = bench(args)
    if args.out is not None:
        write_json(args.out, {**payload, "args": {**payload["args"], "out": str(args.out)}})


if __name__ == "__main__":
    main()
