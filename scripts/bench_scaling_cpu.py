"""Throughput of ``hf-posenc eval`` on 1 and N CPU processes (one thread each), same windows.

A stand-in for multi-GPU scaling where no such machine is at hand: a small random Llama and random
character text are written to a temporary folder, then ``python -m hf_posenc eval`` (P = 1) or
``accelerate launch --multi_gpu --num_processes P -m hf_posenc eval`` scores the same windows; the
scoring time comes from results.json (``seconds``) and the perplexities must agree::

    python scripts/bench_scaling_cpu.py --processes 1,2 --output benchmarks/results/eval_scaling_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

from hf_posenc.eval.results import versions

ROOT = Path(__file__).resolve().parents[1]


def write_fixture(folder: Path, documents: int, chars: int) -> None:
    """A random 4-layer Llama with a character tokenizer, and ``documents`` random texts."""
    vocab = {"<unk>": 0, "<s>": 1, **{chr(c): i + 2 for i, c in enumerate(range(32, 127))}}
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder / "model")
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", unk_token="<unk>").save_pretrained(
        folder / "model"
    )
    (folder / "texts").mkdir()
    rng = random.Random(0)
    for i in range(documents):
        (folder / "texts" / f"{i}.txt").write_text("".join(rng.choice("abcdefgh ijk.") for _ in range(chars)))


def run(folder: Path, processes: int, length: int) -> dict:
    out = folder / f"out{processes}"
    command = [sys.executable]
    if processes > 1:  # accelerate's --multi_gpu launcher (torchrun; gloo on CPU) wants 2 or more
        command += ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes)]
        command += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
        command += ["--main_process_port", "0"]
    command += ["-m", "hf_posenc", "eval", "--model", str(folder / "model")]
    command += ["--dataset", str(folder / "texts"), "--method", "none", "--lengths", str(length)]
    command += ["--protocol", "disjoint", "--output", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run(command, env=env, check=True, capture_output=True)
    result = json.loads((out / "results.json").read_text())["results"][0]
    return {
        "processes": processes,
        "seconds": result["seconds"],
        "tokens": result["tokens"],
        "tokens_per_s": result["tokens"] / result["seconds"],
        "ppl": result["ppl"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", default="1,2", help="process counts to compare (default: 1,2)")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--documents", type=int, default=16)
    parser.add_argument("--output", type=Path, help="write the JSON here too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        write_fixture(Path(tmp), args.documents, 4 * args.length)
        runs = [run(Path(tmp), int(p), args.length) for p in args.processes.split(",")]
    record = {
        "benchmark": "hf-posenc eval on CPU processes, one thread each, same windows",
        "arguments": {"documents": args.documents, "length": args.length, "protocol": "disjoint"},
        "cpu_count": os.cpu_count(),
        "versions": versions(),
        "runs": runs,
        "speedup": runs[-1]["tokens_per_s"] / runs[0]["tokens_per_s"],
    }
    print(json.dumps(record, indent=2))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
