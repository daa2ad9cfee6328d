"""Result writers: the console table, the coverage note, the benchmark smoke."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from hf_posenc.eval.results import coverage_note, format_table

ROOT = Path(__file__).resolve().parents[2]
ROWS = [
    {"method": "none", "length": 2048, "ppl": 25.054},
    {"method": "none", "length": 16384, "ppl": 42.43},
    {"method": "yarn:factor=4", "length": 16384, "ppl": 23.15},
]


def test_console_table():
    assert format_table(ROWS).splitlines() == [
        "method               2k       16k",
        "none              25.05     42.43",
        "yarn:factor=4         -     23.15",
    ]


def test_coverage_note_only_where_lengths_scored_different_documents():
    rows = [
        {"method": m, "length": n, "skipped_documents": skipped}
        for m in ("none", "pi")
        for n, skipped in [(512, 0), (2048, 3)]
    ]
    assert coverage_note(rows, 4) == (
        "Documents scored (of 4; shorter ones are skipped): 4 at 512, 1 at 2k. Columns compare different texts."
    )
    assert coverage_note([{**row, "skipped_documents": 1} for row in rows], 4) is None


def test_bench_script_tiny_smoke():
    spec = importlib.util.spec_from_file_location("bench_eval", ROOT / "scripts" / "bench_eval.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    record = bench.main(["--tiny", "--repeats", "1", "--lengths", "128"])
    (row,) = record["throughput"]
    assert row["length"] == 128 and row["eval_tokens_per_s"] > 0 and row["ratio"] > 0
    assert "peak_memory" not in record  # only measured on a GPU
