"""What do Self-Extend, DCA and log-n cost in attention? One attention call (prefill, causal, B=1) of each
method's backend against causal SDPA without any bias on the same q, k, v, in the same process.

Targets (issue 13, on an H100, H=32, D=128, bf16, 32k and 128k): >= 0.5x causal SDPA for Self-Extend and DCA
(two or three segments: their published kernels pay about two attention passes), >= 0.95x for log-n; memory
linear in n. GPU run, both CUDA backends of the remaps in the same rounds, and a cached step (--decode):
    python scripts/bench_extension.py --device cuda --dtype bfloat16 --lengths 32k,128k --backend flex,sdpa --decode
With flex among the backends, a prefill also times ``flex-causal``: flex on the plain causal mask, compiled as the
remaps' flex calls are (the flex kernel's own speed against SDPA's, apart from what a method adds).
With --profile DIR, one more call of each under torch.profiler: DIR/<length>_<variant>.txt.
CPU (the offline model's shape, SmolLM2-135M: 9 heads, 3 key/value heads, D=64; --backend blocked for the other):
    python scripts/bench_extension.py --device cpu --dtype float32 --heads 9 --kv-heads 3 --head-dim 64 \
        --lengths 4k,8k --context 8192
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.profiler import ProfilerActivity
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import environment, synchronize, time_rounds, write_json  # noqa: E402

import hf_posenc  # noqa: E402, F401  (registers the attention functions)
from hf_posenc.attention import REMAP, TEMPERATURE  # noqa: E402
from hf_posenc.attention.compiled_flex import compiled_flex  # noqa: E402
from hf_posenc.attention.extension import ExtensionState, extension_mask, torch_compiled  # noqa: E402
from hf_posenc.attention.extension_flex import _compiles  # noqa: E402
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


def method_modules(args: argparse.Namespace, rotary: SimpleNamespace) -> dict[str, SimpleNamespace]:
    """Each method of :data:`METHODS` set for the trained context, as the module its attention function reads."""
    modules = {}
    for name, params in METHODS.items():
        resolved = get_method(name).make_params(original_max_position_embeddings=args.context, **params)
        remap = resolved if get_method(name).role == "remap" else None
        temperature = resolved if remap is None else None
        modules[name] = fake_module(
            args.heads, args.kv_heads, ExtensionState(remap, temperature, rotary, args.head_dim)
        )
    return modules


def variants_for(
    args: argparse.Namespace, q_length: int, kv_length: int, device: torch.device, dtype: torch.dtype
) -> dict[str, Callable[[], object]]:
    """One attention call of ``q_length`` queries at the last positions of ``kv_length`` keys (a prefill when they
    are equal, a cached step for one query) for causal SDPA and each method on each of ``args.backend``'s
    backends (``method/backend`` where there are several; log-n wraps SDPA on all of them)."""
    generator = torch.Generator(device).manual_seed(0)

    def states(n_heads: int, length: int) -> torch.Tensor:
        return torch.randn(1, n_heads, length, args.head_dim, generator=generator, device=device, dtype=dtype)

    query, key, value = states(args.heads, q_length), states(args.kv_heads, kv_length), states(args.kv_heads, kv_length)
    rotary = SimpleNamespace(inv_freq=1.0 / 10000 ** (torch.arange(0, args.head_dim, 2, device=device) / args.head_dim))
    offset = kv_length - q_length
    mask = extension_mask(batch_size=1, q_length=q_length, kv_length=kv_length, q_offset=offset, device=device)
    position_ids = torch.arange(offset, kv_length, device=device)[None]
    scale, causal = args.head_dim**-0.5, q_length > 1
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    plain = fake_module(args.heads, args.kv_heads, None)
    variants = {"sdpa": lambda: sdpa(plain, query, key, value, None, scaling=scale, is_causal=causal)}
    backends = args.backend.split(",")
    if "flex" in backends and causal:  # flex's own speed on the plain causal mask: what the remaps' flex calls cost
        variants["flex-causal"] = causal_flex(query, key, value, scale)
    for name, module in method_modules(args, rotary).items():
        if module.hf_posenc_extension.remap is None:
            function = TEMPERATURE["sdpa"].attention
            variants[name] = lambda f=function, m=module: f(
                m, query, key, value, None, scaling=scale, is_causal=causal, position_ids=position_ids
            )
            continue
        for backend in backends:
            function = REMAP[backend].attention
            label = name if len(backends) == 1 else f"{name}/{backend}"
            variants[label] = lambda f=function, m=module: f(m, query, key, value, mask, scaling=scale)
    return variants


def causal_flex(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> Callable[[], object]:
    """Causal attention by flex with a block mask, compiled where the remaps' flex calls are, as they are (a
    prefill: for its shapes; the block mask too, which uncompiled goes through a dense n x n mask): against causal
    SDPA, the flex kernel's own speed, apart from what a method adds to it."""
    compiled = _compiles(query.device, query.shape[2] * key.shape[2])
    build = torch_compiled(create_block_mask, query.is_cuda) if compiled else create_block_mask
    blocks = build(lambda b, h, q, k: q >= k, None, None, query.shape[2], key.shape[2], device=query.device)
    attend = functools.partial(compiled_flex, "causal reference") if compiled else flex_attention
    gqa = query.shape[1] != key.shape[1]
    return lambda: attend(query, key, value, block_mask=blocks, scale=scale, enable_gqa=gqa)


def ratios(seconds: dict[str, float]) -> dict[str, float]:
    return {name: seconds["sdpa"] / value for name, value in seconds.items() if name != "sdpa"}


def differences(variants: dict[str, Callable[[], object]]) -> dict[str, float]:
    """For each method timed on several backends (``method/backend``), the largest difference of each later
    backend's output from the first one's, in float32: a backend that computes something else shows beside its
    time (DCA on flex running Self-Extend's block masks for two of its segments, say)."""
    first: dict[str, torch.Tensor] = {}
    found = {}
    for label, run in variants.items():
        method, _, backend = label.partition("/")
        if not backend:
            continue
        output = run()[0].float()
        if method in first:
            found[label] = (output - first[method]).abs().max().item()
        else:
            first[method] = output
    return found


def run_length(args: argparse.Namespace, length: int, device: torch.device, dtype: torch.dtype) -> dict:
    row: dict = {"length": length, "backend": args.backend}
    with torch.inference_mode():
        variants = variants_for(args, length, length, device, dtype)
        seconds = time_rounds(variants, device, args.repeats)
        row |= {"seconds": seconds, "ratio_vs_sdpa": ratios(seconds)}
        if args.profile is not None:
            profile(variants, device, args.profile / f"{length}")
        decoding = variants_for(args, 1, length, device, dtype) if args.decode else {}
        if decoding:
            decode = time_rounds(decoding, device, args.repeats)
            row |= {"decode_seconds": decode, "decode_ratio_vs_sdpa": ratios(decode)}
        if device.type == "cuda":  # the calls' peak, before the comparison below holds their outputs
            row["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        row["max_abs_difference"] = differences(variants)
        if decoding:
            row["decode_max_abs_difference"] = differences(decoding)
    return row


def profile(variants: dict[str, Callable[[], object]], device: torch.device, prefix: Path) -> None:
    """One more call of each variant under ``torch.profiler``: its operators and kernels by device time, in
    ``<prefix>_<variant>.txt`` (where the time beyond the attention kernel goes; ``method-backend`` for a method
    timed on several backends), then each kernel in launch order."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for name, run in variants.items():
        synchronize(device)
        with torch.profiler.profile(activities=activities) as profiler:
            run()
            synchronize(device)
        table = profiler.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=90)
        Path(f"{prefix}_{name.replace('/', '-')}.txt").write_text(table + "\n" + kernels_in_order(profiler))


def kernels_in_order(profiler: torch.profiler.profile) -> str:
    """The device kernels one by one, in launch order, with their times: which of a method's calls (DCA's three
    segments) costs what, where the table adds up the calls of one kernel. Empty on a CPU."""
    kernels = sorted(
        (event for event in profiler.events() if event.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda event: event.time_range.start,
    )
    lines = [f"{event.device_time:12.1f}  {event.name[:100]}" for event in kernels]
    return "".join(f"{line}\n" for line in ["\nDevice kernels in launch order (us, name):", *lines]) if lines else ""


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
        "--backend",
        default="flex",
        help="remaps' backend: flex, blocked, sdpa or eager, or several separated by commas (timed in the same rounds)",
    )
    parser.add_argument(
        "--decode", action="store_true", help="also time a cached step: one query against the length's keys"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=None, help="results JSON (default: print only)")
    parser.add_argument(
        "--profile", type=Path, default=None, help="folder: also write a torch.profiler table of each call"
    )
    args = parser.parse_args()
    unknown = set(args.backend.split(",")) - set(REMAP.names)
    if unknown:
        parser.error(f"unknown --backend {', '.join(sorted(unknown))}: choose from {', '.join(REMAP.names)}")
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    rows = []
    for length in parse_lengths(args.lengths):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        row = run_length(args, length, device, dtype)
        print(row, flush=True)
        rows.append(row)
        if args.output is not None:  # after each length: a later one that fails or times out keeps the rows done
            write_json(args.output, {"environment": environment(device), "arguments": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
