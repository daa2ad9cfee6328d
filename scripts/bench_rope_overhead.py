"""Does patching cost anything at run time? Tokens/s of one forward, same weights, same process:

* ``unpatched``: the model as loaded;
* ``hf_posenc``: after ``hf_posenc.patch(model, method, ...)``;
* ``native``: the rotary module transformers builds when the method is set natively in the config
  (only for methods transformers can express).

Target: hf_posenc >= 0.99x native and unpatched. On a GPU (Llama-7B shape, bf16):
    python scripts/bench_rope_overhead.py --shape llama-7b --lengths 4096,16384,32768
CPU smoke run:
    python scripts/bench_rope_overhead.py --shape tiny --lengths 512,2048 --device cpu --dtype float32
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import SHAPES, environment, time_rounds, write_json  # noqa: E402

import hf_posenc  # noqa: E402
from hf_posenc.spec import parse_method_spec  # noqa: E402


def build_model(shape: str, dtype: torch.dtype, device: torch.device):
    config = LlamaConfig(**SHAPES[shape], rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def forward_with(model, rotary, ids):
    """One forward (body + last-token logits) with ``rotary`` as the model's rotary module."""

    def run():
        model.model.rotary_emb = rotary
        with torch.inference_mode():
            return model(ids, logits_to_keep=1, use_cache=False)

    return run


def bench(args: argparse.Namespace) -> dict:
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    model = build_model(args.shape, dtype, device)
    unpatched = copy.deepcopy(model.model.rotary_emb)
    results = []
    for spec in args.method:
        name, params = parse_method_spec(spec)
        hf_posenc.patch(model, name, **params)
        info, patched = hf_posenc.get_patch(model), model.model.rotary_emb
        rotaries = {"hf_posenc": patched, "unpatched": unpatched}
        if info.native:  # what from_pretrained builds from the saved config
            rotaries["native"] = type(patched)(copy.deepcopy(model.config)).to(device)
        for length in args.lengths:
            ids = torch.randint(0, model.config.vocab_size, (1, length), device=device)
            variants = {key: forward_with(model, rotary, ids) for key, rotary in rotaries.items()}
            seconds = time_rounds(variants, device, args.repeats)
            row = {"method": spec, "native": info.native, "length": length}
            row.update({f"{key}_tokens_per_s": round(length / value, 1) for key, value in seconds.items()})
            row.update(
                {
                    f"hf_posenc_vs_{key}": round(seconds[key] / seconds["hf_posenc"], 4)
                    for key in seconds
                    if key != "hf_posenc"
                }
            )
            results.append(row)
            print(row, flush=True)
        model.model.rotary_emb = patched
        hf_posenc.unpatch(model)
    return {
        "benchmark": "rope_overhead",
        "shape": args.shape,
        "dtype": args.dtype,
        **environment(device),
        "results": results,
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-7b")
    parser.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[4096, 16384, 32768])
    parser.add_argument(
        "--method", action="append", help="method spec, repeatable (default: yarn, dynamic-ntk, dynamic-yarn)"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/rope_overhead.json"))
    args = parser.parse_args(argv)
    args.method = args.method or ["yarn:factor=4", "dynamic-ntk:factor=4", "dynamic-yarn"]
    return args


if __name__ == "__main__":
    arguments = parse_args()
    write_json(arguments.output, bench(arguments))
