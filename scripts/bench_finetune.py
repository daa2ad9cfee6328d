"""How far does a short fine-tune bring a model back after its position encoding is swapped?

The offline model (SmolLM2-135M, RoPE, trained context 8192) is patched with each method, evaluated, trained for
``--steps`` steps of ``--length`` tokens with ``hf-posenc train`` (all parameters, or ``--trainable``'s), and
evaluated again, on essays held out from training (the bundled Paul Graham essays, sorted by name: the first half
evaluated, the rest trained on). ``none`` is trained the same way, as the control: what the same steps give the
unpatched model (it learns the essays' style too), so each swap's recovery reads against it.

    python scripts/bench_finetune.py --output benchmarks/results/finetune_offline
    python scripts/bench_finetune.py --methods t5-bias --position-learning-rate 1e-2 \
        --output benchmarks/results/finetune_offline/t5_table_lr
    python scripts/bench_finetune.py --methods alibi --trainable lora --steps 300 --warmup-steps 10 --bf16 \
        --output benchmarks/results/finetune_offline_300/lora

Each step is a command of the library (``hf-posenc train`` / ``eval``, run as subprocesses), so a killed run
resumes where it stopped when started again with the same arguments.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from bench_common import environment, write_json  # noqa: E402

from hf_posenc.offline import essays_dir  # noqa: E402

METHODS = ("none", "alibi", "nope", "t5-bias", "pi:factor=2")


def slug(spec: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", spec)


def split_essays(folder: Path, evaluated: int) -> tuple[Path, Path]:
    """Links to the essays: the first ``evaluated`` (by name) in ``eval/``, the rest in ``train/``."""
    essays = sorted(essays_dir().glob("*.txt"))
    for name, part in (("eval", essays[:evaluated]), ("train", essays[evaluated:])):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for essay in part:
            link = folder / name / essay.name
            if not link.exists():
                link.symlink_to(essay)
    return folder / "eval", folder / "train"


def hf_posenc(*argv: str) -> float:
    """Run ``hf-posenc ARGV``; its wall time in seconds."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hf_posenc", *argv], check=True)
    return time.perf_counter() - start


def evaluate(model: list[str], specs: list[str], data: Path, output: Path, args: argparse.Namespace) -> float:
    argv = ["eval", *model, "--dataset", str(data), "--lengths", args.lengths, "--output", str(output)]
    argv += ["--max-documents", str(args.eval_documents)]
    return hf_posenc(*argv, *(item for spec in specs for item in ("--method", spec)))


def rows(results: Path) -> dict[tuple[str, int], dict]:
    return {(row["method"], row["length"]): row for row in json.loads(results.read_text())["results"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated specs (default: {METHODS})")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--length", default="1k", help="training window (default: 1k)")
    parser.add_argument("--learning-rate", default="1e-4")
    parser.add_argument("--warmup-steps", default="5")
    parser.add_argument(
        "--position-learning-rate", help="of what a patch adds, the T5 table (default: --learning-rate)"
    )
    parser.add_argument("--bf16", action="store_true", help="train in bfloat16 autocast (hf-posenc train --bf16)")
    parser.add_argument("--trainable", default="all", help="all, position or lora (hf-posenc train --trainable)")
    parser.add_argument("--lora-rank", default="16", help="with --trainable lora (default: 16)")
    parser.add_argument("--lengths", default="1k,2k", help="evaluation lengths (default: 1k,2k)")
    parser.add_argument("--eval-documents", type=int, default=12, help="held-out essays evaluated (default: 12)")
    args = parser.parse_args()
    specs = args.methods.split(",")
    work = args.output / "runs"
    eval_data, train_data = split_essays(work / "data", 24)

    unpatched_too = ["none", *(spec for spec in specs if spec != "none")]  # the reference line of every row
    seconds = {"before": evaluate([], unpatched_too, eval_data, work / "before", args)}
    before = rows(work / "before" / "results.json")
    summary = []
    for spec in specs:
        trained = work / f"train-{slug(spec)}"
        argv = ["train", "--method", spec, "--dataset", str(train_data), "--length", args.length]
        argv += ["--steps", str(args.steps), "--learning-rate", args.learning_rate, "--warmup-steps", args.warmup_steps]
        if args.position_learning_rate:
            argv += ["--position-learning-rate", args.position_learning_rate]
        argv += ["--bf16"] if args.bf16 else []
        argv += ["--trainable", args.trainable] + (["--lora-rank", args.lora_rank] if args.trainable == "lora" else [])
        argv += ["--output", str(trained)] + (["--resume"] if trained.exists() else [])
        seconds[f"train {spec}"] = hf_posenc(*argv)
        after_dir = work / f"after-{slug(spec)}"
        asked = "none" if spec == "none" else json.loads((trained / "train_summary.json").read_text())["spec"]
        seconds[f"after {spec}"] = evaluate(["--model", str(trained)], [asked], eval_data, after_dir, args)
        after = rows(after_dir / "results.json")
        train = json.loads((trained / "train_summary.json").read_text())
        for (_, length), row in sorted(after.items()):
            summary.append(
                {
                    "method": spec,
                    "length": length,
                    "ppl_before": before[spec, length]["ppl"],
                    "ppl_after": row["ppl"],
                    "ppl_unpatched": before["none", length]["ppl"],
                    "tokens": row["tokens"],
                    "train_seconds": train["seconds"],
                    "train_loss_first": train["losses"][0][1],
                    "train_loss_last": train["losses"][-1][1],
                }
            )
    settings = {key: value for key, value in vars(args).items() if key != "output"}
    report = {
        "environment": environment(torch.device("cpu")),
        "settings": {**settings, "train_essays": 25, "eval_essays": args.eval_documents},
        "results": summary,
        "seconds": seconds,
    }
    write_json(args.output / "finetune.json", report)
    plot(args.output / "finetune.png", summary, args)
    for row in summary:
        print(
            f"{row['method']:>12} {row['length']:>6}: unpatched {row['ppl_unpatched']:.2f}, patched "
            f"{row['ppl_before']:.2f} -> fine-tuned {row['ppl_after']:.2f}"
        )


def plot(path: Path, summary: list[dict], args: argparse.Namespace) -> None:
    """Perplexity (log) per method at each length: patched before training, and after."""
    from matplotlib.figure import Figure

    lengths = sorted({row["length"] for row in summary})
    fig = Figure(figsize=(4 + 2.5 * len(lengths), 4))
    for ax, length in zip(fig.subplots(1, len(lengths), squeeze=False)[0], lengths, strict=True):
        chosen = [row for row in summary if row["length"] == length]
        names = [row["method"] for row in chosen]
        x = torch.arange(len(chosen)).tolist()
        ax.bar([i - 0.2 for i in x], [row["ppl_before"] for row in chosen], 0.4, label="patched, before")
        ax.bar([i + 0.2 for i in x], [row["ppl_after"] for row in chosen], 0.4, label=f"after {args.steps} steps")
        ax.axhline(chosen[0]["ppl_unpatched"], color="gray", linestyle="--", label="unpatched model")
        ax.set_yscale("log")
        ax.set_xticks(x, names, rotation=20)
        ax.set_title(f"{length} tokens", fontsize=9)
        ax.set_ylabel("perplexity (held-out essays)")
    fig.axes[0].legend(fontsize=7)
    trained = "" if args.trainable == "all" else f", trainable {args.trainable}"
    fig.suptitle(f"SmolLM2-135M: swap, then {args.steps} steps x {args.length} tokens{trained} (CPU)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
