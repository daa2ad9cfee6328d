"""Result writers: the console table, the coverage note, the benchmark smoke."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest

from hf_posenc.eval.folder import write_json
from hf_posenc.eval.results import coverage_note, derivation_note, format_table
from hf_posenc.reports.schema import read_report

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
    capped = [{**row, "documents": 2} for row in rows]  # --max-windows 2: the documents reached, not 4 - skipped
    assert coverage_note(capped, 4) is None


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
    assert derivation_note(dynamic + [{"method": "pi", "length": 512}]) is None  # rows without derived_from too


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


def _report_with(rows: list[dict]) -> dict:
    return {
        "protocol": "truncate",
        "model": "tiny",
        "dataset": "essays",
        "dataset_details": {"documents": 2, "tokens": 100},
        "results": [{"length": 512, "tokens": 50, **row} for row in rows],
    }


NON_FINITE_ROWS = [
    {"method": "none", "nll": 3.0, "ppl": math.exp(3.0)},
    {"method": "pi", "nll": 2000.0, "ppl": math.inf},  # diverged: exp(NLL) past the float range
    {"method": "ntk", "nll": math.inf, "ppl": math.inf},
    {"method": "yarn", "nll": math.nan, "ppl": math.nan},  # a numerical failure
]


def _strict(text: str):
    """What JavaScript's JSON.parse, jq or Go accept: no NaN, Infinity or -Infinity."""

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_results_json_is_standard_json_and_reads_back_the_same(tmp_path):
    path = tmp_path / "results.json"
    write_json(path, _report_with(NON_FINITE_ROWS))
    rows = _strict(path.read_text())["results"]
    assert [(r["nll"], r["ppl"], r.get("status")) for r in rows] == [
        (3.0, math.exp(3.0), None),
        (2000.0, None, "overflow"),
        (None, None, "overflow"),
        (None, None, "nan"),
    ]
    back = read_report(path, kind="perplexity", advice="x")["results"]
    assert back[0] == {"length": 512, "tokens": 50, **NON_FINITE_ROWS[0]}
    assert (back[1]["nll"], back[1]["ppl"]) == (2000.0, math.inf)
    assert (back[2]["nll"], back[2]["ppl"]) == (math.inf, math.inf)
    assert math.isnan(back[3]["nll"]) and math.isnan(back[3]["ppl"])


def test_files_with_bare_nan_and_infinity_read(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_report_with(NON_FINITE_ROWS)))  # Python's default: NaN / Infinity written bare
    assert "Infinity" in path.read_text() and "NaN" in path.read_text()
    back = read_report(path, kind="perplexity", advice="x")["results"]
    assert back[1]["ppl"] == math.inf and math.isnan(back[3]["ppl"])


@pytest.mark.parametrize(
    "row,problem",
    [
        ({"method": "pi", "nll": None, "ppl": 3.0}, "results[0] has null as 'ppl' or 'nll' without a 'status'"),
        ({"method": "pi", "nll": 1.0, "ppl": None, "status": "broken"}, "results[0] has status 'broken', not one of"),
    ],
)
def test_a_null_perplexity_needs_its_status(tmp_path, row, problem):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_report_with([row])))
    with pytest.raises(ValueError, match=re.escape(f"{path} is malformed: {problem}")):
        read_report(path, kind="perplexity", advice="x")
