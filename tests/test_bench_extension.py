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


def test_device_kernels_are_listed_in_launch_order_with_their_times():
    """What tells DCA's three flex calls apart on a GPU (the table adds up the calls of one kernel); a CPU's
    profile has no device kernel and no list."""
    import importlib.util
    from types import SimpleNamespace

    import torch

    spec = importlib.util.spec_from_file_location("bench_extension", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def event(name, start, micros, device=torch.autograd.DeviceType.CUDA):
        return SimpleNamespace(
            name=name, device_type=device, time_range=SimpleNamespace(start=start), device_time=micros
        )

    events = [
        event("flex_1", 20, 300.0),
        event("aten::mm", 5, 0.0, torch.autograd.DeviceType.CPU),
        event("flex_0", 10, 12.5),
    ]
    listed = bench.kernels_in_order(SimpleNamespace(events=lambda: events)).splitlines()
    assert listed == ["", "Device kernels in launch order (us, name):", "        12.5  flex_0", "       300.0  flex_1"]
    assert bench.kernels_in_order(SimpleNamespace(events=lambda: events[1:2])) == ""
