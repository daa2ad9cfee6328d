"""How long ``hf-posenc --help`` and ``hf-posenc eval --help`` take, against importing the library (what the help
cost while the command imported torch and transformers to print its usage). Target: at most 1.0 s on 2 idle cores.

    python scripts/bench_cli_help.py            # writes benchmarks/results/cli_help_cpu.json

Each timing is the median wall time of fresh interpreter processes, run in turn in this one script.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import environment, write_json  # noqa: E402

TARGET_SECONDS = 1.0
ROOT = Path(__file__).resolve().parents[1]


def seconds(command: list[str], runs: int) -> float:
    """The median wall time of ``runs`` runs of ``command`` (its output discarded; it must succeed)."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "cli_help_cpu.json")
    args = parser.parse_args()
    script = shutil.which("hf-posenc") or "hf-posenc"
    commands = {
        "hf-posenc --help": [script, "--help"],
        "hf-posenc eval --help": [script, "eval", "--help"],
        "hf-posenc train --help": [script, "train", "--help"],
        "import hf_posenc (the library: torch, transformers)": [sys.executable, "-c", "import hf_posenc"],
    }
    timings = {name: round(seconds(command, args.runs), 3) for name, command in commands.items()}
    reference = timings["import hf_posenc (the library: torch, transformers)"]
    import torch

    report = {
        "what": "median wall seconds of fresh processes; the reference is the library import the help once paid",
        "target_seconds": TARGET_SECONDS,
        "runs": args.runs,
        "cores": os.cpu_count(),
        "seconds": timings,
        "help_over_library_import": round(timings["hf-posenc --help"] / reference, 3),
        "meets_target": all(value <= TARGET_SECONDS for name, value in timings.items() if name.startswith("hf-posenc")),
        **environment(torch.device("cpu")),
    }
    write_json(args.output, report)
    for name, value in timings.items():
        print(f"{value:7.3f} s  {name}")


if __name__ == "__main__":
    main()
