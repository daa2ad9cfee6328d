"""Result writers: the console table, the coverage note, the benchmark smoke."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from hf_posenc.eval.results import coverage_note, derivation_note, format_table

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


def test_derivation_note_names_the_lengths_read_from_a_longer_forward():
    def rows(method, sources):
        return [{"method": method, "length": n, "derived_from": source} for n, source in sources.items()]

    shared = {2048: 16384, 8192: 16384, 16384: None}
    assert derivation_note(rows("none", shared) + rows("yarn:factor=4", shared)) == (
        "2k, 8k derived from the 16k forward of each document (one forward per document; see --help)."
    )
    dynamic = rows("dynamic-ntk:factor=4", dict.fromkeys(shared))
    assert derivation_note(rows("none", shared) + dynamic) == (
        "2k, 8k derived from the 16k forward of each document for none; the other rows: one forward per length "
        "(see --help)."
    )
    resumed = rows("none", {1024: 4096, 4096: None, 8192: 32768, 32768: None})  # two runs into one folder
    assert derivation_note(resumed + rows("pi:factor=2", {1024: None})) == (
        "1k derived from the 4k forward, 8k derived from the 32k forward of each document for none; the other "
        "rows: one forward per length (see --help)."
    )
    assert derivation_note(dynamic + [{"method": "pi", "length": 512}]) is None  # rows of older versions too


def test_bench_script_tiny_smoke():
    spec = importlib.util.spec_from_file_location("bench_eval", ROOT / "scripts" / "bench_eval.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    record = bench.main(["--tiny", "--repeats", "1", "--lengths", "128"])
    (row,) = record["throughput"]
    assert row["length"] == 128 and row["eval_tokens_per_s"] > 0 and row["ratio"] > 0
    assert "peak_memory" not in record  # only measured on a GPU


def test_bench_eval_lengths_script_loads_and_compares_rows_of_the_same_method_and_length():
    """The benchmark runs the real model only (see its docstring for the check at small lengths); here: it
    imports, and its NLL comparison pairs rows by (method, length)."""
    spec = importlib.util.spec_from_file_location("bench_eval_lengths", ROOT / "scripts" / "bench_eval_lengths.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    before = [{"method": "none", "length": n, "nll": 3.0} for n in (2048, 16384)]
    after = [
        {"method": "none", "length": 16384, "nll": 3.0 * (1 + 1e-7)},
        {"method": "none", "length": 2048, "nll": 3.0},
    ]
    assert abs(bench.max_relative_difference(after, before) - 1e-7) < 1e-12
