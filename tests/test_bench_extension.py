"""scripts/bench_extension.py as the GPU run calls it (scripts/gpu_run.sh's extension stage: several backends in the
same rounds, a cached step, a profile of each call), on the CPU at a tiny size: every variant timed, a ratio to
SDPA for each, the JSON and one profile table per variant written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_extension.py"


def test_several_backends_with_decode_and_profile_write_every_variant(tmp_path):
    output, profile = tmp_path / "bench.json", tmp_path / "profile"
    arguments = ["--device", "cpu", "--dtype", "float32", "--heads", "2", "--kv-heads", "1", "--head-dim", "16"]
    arguments += ["--lengths", "256", "--context", "64", "--backend", "sdpa,flex", "--decode", "--repeats", "1"]
    subprocess.run(
        [sys.executable, SCRIPT, *arguments, "--output", output, "--profile", profile], check=True, capture_output=True
    )
    result = json.loads(output.read_text())
    variants = {"self-extend/sdpa", "self-extend/flex", "dca/sdpa", "dca/flex", "logn", "flex-causal"}
    (row,) = result["rows"]
    assert set(row["seconds"]) == variants | {"sdpa"} and set(row["ratio_vs_sdpa"]) == variants
    assert set(row["decode_ratio_vs_sdpa"]) == variants - {"flex-causal"}  # a prefill's reference
    assert all(value > 0 for value in [*row["ratio_vs_sdpa"].values(), *row["decode_ratio_vs_sdpa"].values()])
    assert result["arguments"]["profile"] == str(profile)
    written = {path.name for path in profile.iterdir()}
    assert written == {f"256_{name.replace('/', '-')}.txt" for name in variants | {"sdpa"}}
