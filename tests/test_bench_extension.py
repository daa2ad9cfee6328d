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
    for key in ("max_abs_difference", "decode_max_abs_difference"):  # flex against sdpa, the first backend
        assert set(row[key]) == {"self-extend/flex", "dca/flex"} and max(row[key].values()) < 1e-4
    assert all(value > 0 for value in [*row["ratio_vs_sdpa"].values(), *row["decode_ratio_vs_sdpa"].values()])
    assert result["arguments"]["profile"] == str(profile)
    written = {path.name for path in profile.iterdir()}
    assert written == {f"256_{name.replace('/', '-')}.txt" for name in variants | {"sdpa"}}


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_extension", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_rows_done_are_written_before_a_later_length_fails(tmp_path, monkeypatch):
    """A GPU run is cut by its timeout or fails at 128k: the 32k row is in the JSON already (each row is written
    when it is done, not at the end)."""
    import pytest

    bench, output = _bench(), tmp_path / "bench.json"

    def run_length(args, length, device, dtype):
        if length > 256:
            raise RuntimeError("out of memory")
        return {"length": length}

    monkeypatch.setattr(bench, "run_length", run_length)
    monkeypatch.setattr(sys, "argv", ["bench", "--device", "cpu", "--lengths", "256,512", "--output", str(output)])
    with pytest.raises(RuntimeError, match="out of memory"):
        bench.main()
    assert json.loads(output.read_text())["rows"] == [{"length": 256}]


def test_device_kernels_are_listed_in_launch_order_with_their_times():
    """What tells DCA's three flex calls apart on a GPU (the table adds up the calls of one kernel); a CPU's
    profile has no device kernel and no list."""
    from types import SimpleNamespace

    import torch

    bench = _bench()

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


def test_a_backend_computing_something_else_shows_its_difference():
    import torch

    bench, ones = _bench(), torch.ones(1, 4, 2, 8)
    variants = {
        "sdpa": lambda: (ones * 5, None),  # the reference alone: not compared
        "dca/sdpa": lambda: (ones, None),
        "dca/flex": lambda: (ones * 2, None),
        "self-extend/sdpa": lambda: (ones, None),
        "self-extend/flex": lambda: (ones.clone(), None),
    }
    assert bench.differences(variants) == {"dca/flex": 1.0, "self-extend/flex": 0.0}
