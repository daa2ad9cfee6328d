"""A tune's wall time against the sum of its candidates' single forwards at the target, on the offline model.

``hf-posenc tune`` promises one forward per candidate and document at ``T`` for every method whose output does not
depend on the input's length (the lengths inside ``L`` read from it). Here the tune runs in full (model loading,
tokenizing, the unpatched model, writing its folder), then each of its candidates and the unpatched model is
applied to the same loaded model and scored alone on the same window at ``T`` (the evaluation's forward and chunked
loss, :func:`~hf_posenc.eval.scoring.score_lengths`), in the same process. The target: tune / sum <= 1.1. The same
forwards rank the candidates as separate runs would: their best must be the tune's winner or tied with it.

    python scripts/bench_tune.py --target-length 16384 --methods yarn,self-extend,dca \\
        --out benchmarks/results/tune_cpu.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from accelerate import Accelerator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import environment, write_json  # noqa: E402

import hf_posenc  # noqa: E402
from hf_posenc.eval import ModelSource, TextSource  # noqa: E402
from hf_posenc.eval.data import build_windows, load_texts, tokenize_texts  # noqa: E402
from hf_posenc.eval.models import load_model, load_tokenizer, resolve_bos  # noqa: E402
from hf_posenc.eval.scoring import score_lengths  # noqa: E402
from hf_posenc.offline import essays_dir  # noqa: E402
from hf_posenc.spec import MethodSpec  # noqa: E402
from hf_posenc.tuning import TuneConfig, run_tune  # noqa: E402

TARGET_RATIO = 1.1


def _single_forwards(source: ModelSource, texts: TextSource, methods: list[str], length: int) -> dict[str, dict]:
    """Each method applied to one loaded model and scored alone on the first window of ``length`` tokens."""
    accelerator = Accelerator(cpu=True)
    tokenizer = load_tokenizer(source)
    bos_id = resolve_bos("auto", tokenizer)
    docs = tokenize_texts(tokenizer, load_texts(texts))
    model = load_model(source, accelerator.device)
    plan = build_windows([len(d) for d in docs], length, "truncate", bos=bos_id is not None).windows
    measured = {}
    for method in methods:
        context = hf_posenc.patched(model, MethodSpec.parse(method)) if method != "none" else torch.no_grad()
        with context:
            backend = (hf_posenc.get_patch(model).params.get("backend") if method != "none" else None) or "sdpa"
            start = time.perf_counter()
            score = score_lengths(model, docs, {length: plan}, accelerator=accelerator, bos_id=bos_id)[length]
            seconds = time.perf_counter() - start
        nll = sum(value for value, _ in score.windows) / sum(count for _, count in score.windows)
        measured[method] = {"seconds": round(seconds, 2), "nll": nll, "attention": backend}
        print(method, measured[method], flush=True)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target-length", type=int, default=16384)
    parser.add_argument("--methods", default="yarn,self-extend,dca", help="the families tuned")
    parser.add_argument("--out", type=Path, default=None, help="results JSON (printed only when omitted)")
    parser.add_argument("--tune-folder", type=Path, default=None, help="keep the tune's folder here (a new one)")
    args = parser.parse_args()
    if args.tune_folder is not None and args.tune_folder.exists():
        parser.error(f"--tune-folder {args.tune_folder} exists: the tune must run in full to be timed")
    source = ModelSource.named(None)
    texts = TextSource(str(essays_dir()), join="\n\n")
    config = TuneConfig(target_length=args.target_length, methods=args.methods.split(","), logn=False)
    with tempfile.TemporaryDirectory() as scratch:
        start = time.perf_counter()
        report = run_tune(source, texts, config, args.tune_folder or Path(scratch))
        tune_seconds = time.perf_counter() - start
    print(report.table(), flush=True)
    methods = ["none", *(row.method for row in report.rows)]
    alone = _single_forwards(source, texts, methods, args.target_length)
    total = sum(row["seconds"] for row in alone.values())
    eligible = [row.method for row in report.rows if row.eligible]
    separate_best = min(eligible, key=lambda method: alone[method]["nll"]) if eligible else None
    winners = {report.best.text, *report.tied_with_best} if report.best else set()
    payload = {
        "benchmark": "tune_wall_time",
        "model": source.label,
        "data": "the bundled essays joined into one document (one truncate window per length)",
        "environment": environment(torch.device("cpu")),
        "target_length": args.target_length,
        "families": config.methods,
        "candidates": len(report.rows),
        "tune_seconds": round(tune_seconds, 2),
        "single_forwards": alone,
        "single_forwards_seconds": round(total, 2),
        "ratio": round(tune_seconds / total, 3),
        "target_ratio": TARGET_RATIO,
        "meets_target": tune_seconds / total <= TARGET_RATIO,
        "tune_best": report.best.text if report.best else None,
        "tied_with_best": report.tied_with_best,
        "separate_forwards_best": separate_best,
        "same_winner": separate_best in winners,
        "table": report.table().splitlines(),
    }
    print({key: payload[key] for key in ("tune_seconds", "single_forwards_seconds", "ratio", "same_winner")})
    if args.out is not None:
        write_json(args.out, payload)


if __name__ == "__main__":
    main()
