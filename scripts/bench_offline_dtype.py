"""The offline default's dtype on this CPU: one truncate window per length, float32 against bfloat16.

``hf-posenc eval`` without ``--model`` picks bfloat16 where the CPU computes it natively; transformers
keeps a GGUF model's weights packed and its kernels compute in float32, so that choice is measured here
rather than assumed: seconds per window (the model's forward and the chunked loss, as the evaluation
runs them) and the perplexity, each dtype loaded in the same process, in alternating order.

    python scripts/bench_offline_dtype.py --lengths 2048,16384 --out benchmarks/results/offline_dtype_cpu.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import environment, write_json  # noqa: E402

from hf_posenc.eval.data import TextSource, load_texts  # noqa: E402
from hf_posenc.eval.perplexity import perplexity, window_nll  # noqa: E402
from hf_posenc.offline import essays_dir, smollm2_gguf  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[2048, 16384])
    parser.add_argument("--out", type=Path, default=None, help="results JSON (printed only when omitted)")
    args = parser.parse_args()
    folder, name = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    text = "\n\n".join(load_texts(TextSource(str(essays_dir()))))
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    models = {
        key: AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype).eval()
        for key, dtype in DTYPES.items()
    }
    for model in models.values():
        window_nll(model, ids[:, :256], 1)  # warm-up
    rows = []
    for index, length in enumerate(args.lengths):
        window = ids[:, :length]
        for key in list(models)[:: 1 if index % 2 else -1]:  # alternating which dtype runs first
            start = time.perf_counter()
            nll = window_nll(models[key], window, 1).item()
            seconds = time.perf_counter() - start
            row = {"length": length, "dtype": key, "seconds": seconds, "ppl": perplexity(nll, length - 1)[1]}
            rows.append(row)
            print(row, flush=True)
    payload = {
        "benchmark": "offline_default_dtype",
        "model": name,
        "environment": environment(torch.device("cpu")),
        "bf16_native": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        "results": rows,
    }
    if args.out is not None:
        write_json(args.out, payload)


if __name__ == "__main__":
    main()
