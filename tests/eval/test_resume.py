"""Resuming in an output folder: the checks that read only (arguments, malformed files, someone else's files,
data by content) and the one cleanup (a killed run's temporaries)."""

from __future__ import annotations

import json
import math
import os
import re
import time

import pytest

from hf_posenc.eval.folder import PASSKEY as PASSKEY_LAYOUT
from hf_posenc.eval.folder import (
    PASSKEY_FILES,
    PERPLEXITY_FILES,
    ResultsFolder,
    check_output,
    load_previous,
    remove_stale_temporaries,
)
from hf_posenc.eval.resume import check_same_data, document_hashes
from hf_posenc.files import STALE_AFTER

ROW = {"method": "none", "length": 2048, "ppl": 25.054, "nll": 3.22, "tokens": 2047}
REPORT = {
    "protocol": "truncate",
    "model": "org/tiny",
    "dataset": "texts",
    "arguments": {"protocol": "truncate", "bos": "auto"},
    "dataset_details": {"documents": 1, "tokens": 5000},
    "protocol_details": {"bos": True},
    "model_details": {"dtype": "float32", "trained_context": 8192},
    "results": [ROW],
}
TRIAL = {"method": "none", "length": 1024, "depth": 0.5, "key": "12345", "correct": True}
CELL = {"method": "none", "length": 1024, "depth": 0.5, "accuracy": 1.0, "trials": 1}
PASSKEY = {"model": "org/tiny", "arguments": {"seed": 0}, "trials": [TRIAL], "accuracy": [CELL]}


def test_load_previous_names_the_differing_arguments(tmp_path):
    path = tmp_path / "results.json"
    assert load_previous(path, {"protocol": "truncate"}, kind="perplexity") is None
    path.write_text(json.dumps(REPORT))
    assert load_previous(path, {"protocol": "truncate", "bos": "auto"}, kind="perplexity")["results"] == [ROW]
    with pytest.raises(
        ValueError, match=r"arguments \(protocol: 'truncate' then, 'sliding' now; stride: None then, 512"
    ):
        load_previous(path, {"protocol": "sliding", "bos": "auto", "stride": 512}, kind="perplexity")
    # --bos is compared by what it resolves to (check_same_bos), but by its spelling in a passkey file that does not
    # say whether it scored with a BOS token (its optional "bos" left out)
    assert load_previous(path, {"protocol": "truncate", "bos": "none"}, kind="perplexity")["results"] == [ROW]
    passkey = tmp_path / "passkey.json"
    passkey.write_text(json.dumps({**PASSKEY, "arguments": {"bos": "auto"}}))
    with pytest.raises(ValueError, match=r"arguments \(bos: 'auto' then, 'none' now\)"):
        load_previous(passkey, {"bos": "none"}, kind="passkey")
    passkey.write_text(json.dumps({**PASSKEY, "arguments": {"bos": "auto"}, "bos": False}))
    assert load_previous(passkey, {"bos": "none"}, kind="passkey")["trials"] == [TRIAL]


def test_the_same_folder_spelled_otherwise_is_the_same_argument(tmp_path, monkeypatch):
    """``texts/`` or ``./texts`` for ``texts``: the same data (their documents are compared by hash after)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "texts").mkdir()
    path = tmp_path / "results.json"
    path.write_text(json.dumps({**REPORT, "arguments": {**REPORT["arguments"], "dataset": {"name": "texts"}}}))
    for spelling in ("texts/", "./texts", str(tmp_path / "texts")):
        arguments = {"protocol": "truncate", "bos": "auto", "dataset": {"name": spelling}}
        assert load_previous(path, arguments, kind="perplexity")["results"] == [ROW]
    with pytest.raises(ValueError, match=r"dataset: \{'name': 'texts'\} then, \{'name': 'text'\} now"):
        load_previous(path, {"protocol": "truncate", "bos": "auto", "dataset": {"name": "text"}}, kind="perplexity")
    arguments = {"protocol": ".", "bos": "auto", "dataset": {"name": "texts"}}  # a folder, but no path argument
    with pytest.raises(ValueError, match="protocol: 'truncate' then, '.' now"):
        load_previous(path, arguments, kind="perplexity")
    arguments = {"protocol": "truncate", "bos": "auto", "dataset": {"name": "x" * 300}}  # too long for the OS
    with pytest.raises(ValueError, match="dataset: "):
        load_previous(path, arguments, kind="perplexity")


@pytest.mark.parametrize(
    ("content", "problem"),
    [("garbage", "not JSON: Expecting value"), ("[]", "a JSON list"), (b"\x89PNG\r\n\x1a\n", "not UTF-8 text")],
)
def test_load_previous_names_a_file_that_is_not_a_record(tmp_path, content, problem):
    path = tmp_path / "results.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))} is not a results file \({problem}"):
        load_previous(path, {"protocol": "truncate"}, kind="perplexity")


def _without(entry: dict, key: str) -> dict:
    return {k: v for k, v in entry.items() if k != key}


MALFORMED = [
    ({**REPORT, "results": [_without(ROW, "length")]}, "results[0] has no 'length'"),
    ({**REPORT, "results": [_without(ROW, "ppl")]}, "results[0] has no 'ppl'"),
    ({**REPORT, "results": [ROW, _without(ROW, "method")]}, "results[1] has no 'method'"),
    ({**REPORT, "results": None}, "the file has null as 'results', not a list"),
    ({**REPORT, "results": "none 25.05"}, "the file has a string as 'results', not a list"),
    ({**REPORT, "results": [["none", 2048]]}, "results[0] is a list, not an object"),
    ({**REPORT, "results": [{**ROW, "length": "2k"}]}, "results[0] has a string as 'length', not an integer"),
    ({**REPORT, "results": [{**ROW, "length": True}]}, "results[0] has a boolean as 'length', not an integer"),
    ({**REPORT, "results": [{**ROW, "length": -1}]}, "results[0] has length -1, not a positive number of tokens"),
    (
        {**REPORT, "results": [{**ROW, "ppl": "25"}]},
        "results[0] has a string as 'ppl', not an integer or a number or null (with a 'status')",
    ),
    ({**REPORT, "results": [{**ROW, "params": "factor=4"}]}, "results[0] has a string as 'params', not an object"),
    (_without(REPORT, "dataset_details"), "the file has no 'dataset_details'"),
    ({**REPORT, "dataset_details": {"documents": 1}}, "'dataset_details' has no 'tokens'"),
    ({**REPORT, "dataset_details": {**REPORT["dataset_details"], "document_hashes": 3}}, "'document_hashes'"),
    (_without(REPORT, "arguments"), "the file has no 'arguments'"),
    ({**REPORT, "arguments": []}, "the file has a list as 'arguments', not an object"),
    (_without(REPORT, "model_details"), "the file has no 'model_details'"),
    ({**REPORT, "protocol_details": {"bos": "yes"}}, "'protocol_details' has a string as 'bos', not a boolean"),
    ({**REPORT, "model_details": {"dtype": "float32"}}, "'model_details' has no 'trained_context'"),
    (
        {**REPORT, "model_details": {**REPORT["model_details"], "fingerprint": 3}},
        "'model_details' has an integer as 'fingerprint', not a string",
    ),
]


@pytest.mark.parametrize(("report", "problem"), MALFORMED)
def test_a_malformed_results_file_is_one_line_naming_the_file_and_the_field(tmp_path, report, problem):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(report))
    with pytest.raises(ValueError) as error:
        load_previous(path, REPORT["arguments"], kind="perplexity")
    message = str(error.value)
    assert message.startswith(f"{path} is malformed: ") and problem in message and "\n" not in message


@pytest.mark.parametrize(
    ("report", "problem"),
    [
        ({**PASSKEY, "trials": [_without(TRIAL, "correct")]}, "trials[0] has no 'correct'"),
        ({**PASSKEY, "trials": None}, "the file has null as 'trials'"),
        ({**PASSKEY, "accuracy": [{**CELL, "accuracy": None}]}, "accuracy[0] has null as 'accuracy'"),
        (_without(PASSKEY, "accuracy"), "the file has no 'accuracy'"),
        ({**PASSKEY, "model_details": []}, "the file has a list as 'model_details', not an object"),
        ({**PASSKEY, "model_details": {"fingerprint": None}}, "'model_details' has null as 'fingerprint'"),
        # cells that are not the trials' (a file written back as read would keep them), and depths past the prompt
        ({**PASSKEY, "accuracy": []}, "the trials of 'none' at 1024 tokens have no accuracy cell"),
        ({**PASSKEY, "trials": [TRIAL, TRIAL]}, "accuracy[0] ('none' at 1024 tokens, depth 0.5) is not the share"),
        (
            {**PASSKEY, "accuracy": [{**CELL, "accuracy": 0.0}]},
            "accuracy[0] ('none' at 1024 tokens, depth 0.5) is not the share correct of its 1 trials",
        ),
        ({**PASSKEY, "accuracy": [CELL, CELL]}, "accuracy[1] repeats accuracy[0], 'none' at 1024 tokens, depth 0.5"),
        ({**PASSKEY, "trials": [{**TRIAL, "depth": 1.5}]}, "trials[0] has depth 1.5, not a fraction of the prompt"),
        ({**PASSKEY, "trials": [{**TRIAL, "depth": math.nan}]}, "trials[0] has depth nan, not a fraction"),
    ],
)
def test_a_malformed_passkey_file_is_one_line_naming_the_field(tmp_path, report, problem):
    path = tmp_path / "passkey.json"
    path.write_text(json.dumps(report))
    with pytest.raises(ValueError, match=re.escape(f"{path} is malformed: {problem}")):
        load_previous(path, PASSKEY["arguments"], kind="passkey")
    assert load_previous(path.with_name("ok.json"), {}, kind="passkey") is None


@pytest.mark.parametrize("files", [PERPLEXITY_FILES, PASSKEY_FILES])
def test_files_of_the_run_without_its_report_belong_to_someone_else(tmp_path, files):
    report, csv_file, plot = files
    (tmp_path / csv_file).write_text("mine")
    (tmp_path / plot).write_bytes(b"mine")
    with pytest.raises(ValueError, match=rf"holds {re.escape(csv_file)} and {re.escape(plot)} but no {report}"):
        check_output(tmp_path, files)
    (tmp_path / report).write_text("{}")  # a run's: resumable (or refused by what it holds)
    check_output(tmp_path, files)
    check_output(tmp_path / "new", files)  # a folder to create


def test_resuming_compares_the_tokens_of_every_document():
    docs = [[1, 2, 3], [4, 5, 6]]
    details = {"documents": 2, "tokens": 6, "document_hashes": document_hashes(docs)}
    check_same_data(details, details, "r.json")
    changed = {**details, "document_hashes": document_hashes([[1, 2, 3], [4, 6, 5]])}  # same counts
    with pytest.raises(ValueError, match=r"document 1 has other tokens now \(same counts"):
        check_same_data(details, changed, "r.json")
    with pytest.raises(ValueError, match=r"2 documents of 6 tokens then, 2 documents of 7 tokens now"):
        check_same_data(details, {**details, "tokens": 7}, "r.json")
    counts = {"documents": 2, "tokens": 6}  # without the optional hashes: counts only
    check_same_data(counts, changed, "r.json")
    assert len(set(document_hashes([[1, 2], [2, 1], [1, 2, 0], [258]]))) == 4


def test_a_killed_runs_temporaries_are_removed_and_nothing_else(tmp_path):
    ours = [".ppl_vs_length.0123456789abcdef0123456789abcdef.png", ".results.fedcba9876543210fedcba9876543210.json"]
    others = [".ppl_vs_length.mine.png", ".notes.0123456789abcdef0123456789abcdef.png", "results.csv", "a.png"]
    for name in ours + others:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / ".hf-posenc-check-x1").mkdir()
    (tmp_path / ".hf-posenc-check-full").mkdir()
    (tmp_path / ".hf-posenc-check-full" / "f").write_text("someone's")
    remove_stale_temporaries(tmp_path, PERPLEXITY_FILES)  # all new: maybe another run's, writing or checking now
    assert len(list(tmp_path.iterdir())) == len(ours + others) + 2
    then = time.time() - STALE_AFTER - 1
    for path in tmp_path.iterdir():
        os.utime(path, (then, then))
    remove_stale_temporaries(tmp_path, PERPLEXITY_FILES)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*others, ".hf-posenc-check-full"])


def test_the_fingerprint_reads_weights_and_rope_buffers_and_survives_a_patch_undone():
    """Same weights, same fingerprint (a patch undone included); a weight scaled, or another RoPE base (its
    ``inv_freq`` buffer), another one; a model built on the meta device has none (its offloaded weights are read:
    tests/eval/test_fingerprint_offload.py)."""
    import torch
    from tiny_models import make_tiny

    import hf_posenc
    from hf_posenc.hub.fingerprint import model_fingerprint

    model = make_tiny("llama")
    fingerprint = model_fingerprint(model)
    assert re.fullmatch(r"[0-9a-f]{16}", fingerprint) and model_fingerprint(make_tiny("llama")) == fingerprint
    with hf_posenc.patched(model, "yarn", factor=4):
        assert model_fingerprint(model) != fingerprint  # inv_freq
    assert model_fingerprint(model) == fingerprint
    assert model_fingerprint(make_tiny("llama", seed=1)) != fingerprint
    other_base = make_tiny("llama")
    other_base.config.rope_parameters["rope_theta"] = 500_000.0
    other_base.model.rotary_emb.__init__(other_base.config)
    assert model_fingerprint(other_base) != fingerprint
    with torch.no_grad():
        model.model.norm.weight.mul_(1.001)
    assert model_fingerprint(model) != fingerprint
    with torch.device("meta"), pytest.raises(ValueError, match="is on the meta device with its values nowhere"):
        model_fingerprint(make_tiny("llama"))


@pytest.mark.parametrize("files", [PERPLEXITY_FILES, PASSKEY_FILES])
def test_a_folder_where_the_run_writes_a_file_is_refused_up_front(tmp_path, files):
    """A folder (or anything not a file) where a run writes one of its files: refused before the run (not after it
    computed and replaced its report, on a bare "[Errno 21] Is a directory")."""
    report, csv_file, _ = files
    (tmp_path / report).write_text("{}")
    (tmp_path / csv_file).mkdir()
    with pytest.raises(ValueError, match=rf"{re.escape(str(tmp_path / csv_file))} is not a file, and this run writes"):
        check_output(tmp_path, files)


def test_a_results_folder_writes_its_files_only_over_the_report_it_read(tmp_path):
    """The folder's owner: the report, its CSV and its heatmap written together; never before the report already
    there was read; never over a report another process wrote since."""
    folder = ResultsFolder(tmp_path / "out", PASSKEY_LAYOUT)
    folder.check()
    with pytest.raises(RuntimeError, match=r"before previous\(\)"):
        folder.write(PASSKEY)
    assert folder.previous(PASSKEY["arguments"]) is None and not folder.path.exists()
    folder.write(PASSKEY)
    assert json.loads(folder.report_path.read_text()) == PASSKEY
    assert sorted(path.name for path in folder.path.iterdir()) == sorted(PASSKEY_FILES)
    assert (folder.path / PASSKEY_FILES[1]).read_text().splitlines()[1] == "none,1024,0.5,1.0,1"
    again = ResultsFolder(folder.path, PASSKEY_LAYOUT)
    assert again.previous(PASSKEY["arguments"]) == PASSKEY
    folder.write({**PASSKEY, "model": "org/other"})  # this run's own write: the other reader has not seen it
    with pytest.raises(ValueError, match="was written by another process while this run went on"):
        again.write(PASSKEY)
    assert json.loads(folder.report_path.read_text())["model"] == "org/other"
