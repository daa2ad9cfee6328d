"""The typed run reports: each is its results file, field for field, and reads back what a run wrote."""

from __future__ import annotations

import json
import math

import pytest

from hf_posenc.reports.runs import PasskeyReport, PerplexityReport, PerplexityRow

ROW = {
    "method": "yarn:factor=4",
    "params": {"factor": 4.0, "original_max_position_embeddings": 64},
    "length": 128,
    "ppl": 12.5,
    "nll": math.log(12.5),
    "tokens": 127,
    "windows": 1,
    "documents": 1,
    "skipped_documents": 0,
    "dropped_tokens": 0,
    "forwards": 0,
    "derived_from": 256,
    "seconds": 0.5,
}
REPORT = {
    "protocol": "truncate",
    "model": "tiny",
    "dataset": "texts",
    "versions": {"hf_posenc": "0.1.0"},
    "protocol_details": {"stride": None, "bos": True, "mean": "token-weighted over scored tokens", "note": None},
    "model_details": {"name": "tiny", "dtype": "float32", "trained_context": 64},
    "dataset_details": {"documents": 1, "tokens": 300},
    "processes": 1,
    "device": "cpu",
    "arguments": {"protocol": "truncate"},
    "results": [ROW, {**ROW, "method": "none", "params": {}, "ppl": 20.0, "nll": math.log(20.0)}],
}


def test_a_perplexity_report_is_its_file_field_for_field(tmp_path):
    report = PerplexityReport.from_json(REPORT)
    assert report.to_json() == REPORT
    assert report.ppl("none", 128) == 20.0 and report.ppl("none", 256) is None
    assert report.results[0] == PerplexityRow(**ROW)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(REPORT))
    assert PerplexityReport.read(path) == report


def test_a_row_with_the_required_fields_alone_reads_with_what_it_has():
    """Rows of files that lack the optional fields (made by hand or by another program), and a non-finite row's
    ``status``, read as far as they go."""
    required = {key: ROW[key] for key in ("method", "length", "ppl", "nll", "tokens")}
    row = PerplexityRow.from_json({**required, "status": "overflow"})
    assert (row.params, row.windows, row.derived_from) == ({}, None, None)


def test_a_malformed_file_is_named(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({**REPORT, "results": [{**ROW, "length": "long"}]}))
    with pytest.raises(ValueError, match=f"{path} is malformed"):
        PerplexityReport.read(path)


def test_a_passkey_report_is_its_file_field_for_field(tmp_path):
    data = {
        "task": "passkey retrieval",
        "model": "tiny",
        "model_details": {"dtype": "float32"},
        "bos": True,
        "versions": {},
        "processes": 1,
        "device": "cpu",
        "arguments": {"seed": 0},
        "prompt_hashes": {"400": "ab"},
        "trials": [{"method": "none", "length": 400, "depth": 0.5, "key": 12345, "correct": True}],
        "accuracy": [{"method": "none", "length": 400, "depth": 0.5, "accuracy": 1.0, "trials": 1}],
    }
    report = PasskeyReport.from_json(data)
    assert report.to_json() == data and report.trials[0].correct and report.accuracy[0].accuracy == 1.0
    path = tmp_path / "passkey.json"
    path.write_text(json.dumps(data))
    assert PasskeyReport.read(path) == report
