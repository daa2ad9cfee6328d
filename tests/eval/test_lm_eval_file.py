"""``lm_eval.json`` read back (a card, a push): a malformed file is one ValueError naming the file and what is wrong,
never a TypeError, a silent choice between two runs of a method, or a note of the card silently left out."""

from __future__ import annotations

import json

import pytest

from hf_posenc.reports.schema import read_report

ADVICE = "pass the lm_eval.json of an `hf-posenc lm-eval` run"


YARN = {"factor": 4.0, "original_max_position_embeddings": 64}  # yarn:factor=4 resolved on a model of L = 64


def _run(method: str, acc: float) -> dict:
    params = YARN if method.startswith("yarn") else {}
    return {"method": method, "params": params, "results": {"copy": {"acc,none": acc, "acc_stderr,none": None}}}


def lm_eval_json(**changes) -> dict:
    """What ``hf-posenc lm-eval`` writes, in the fields a reader uses, with ``changes`` over them."""
    report = {
        "model": "org/tiny",
        "model_details": {"name": "org/tiny", "dtype": "float32"},
        "lm_eval_version": "0.4.13",
        "max_length": 256,
        "arguments": {"tasks": ["copy"], "batch_size": 1, "limit": 0.5},
        "runs": [_run("none", 0.25), _run("yarn:factor=4", 0.5)],
    }
    return {**report, **changes}


def write(tmp_path, report) -> object:
    path = tmp_path / "lm_eval.json"
    path.write_text(json.dumps(report))
    return path


def test_a_file_as_lm_eval_writes_it_reads_back(tmp_path):
    report = lm_eval_json()
    assert read_report(write(tmp_path, report), kind="lm-eval", advice=ADVICE) == report
    plain = {key: value for key, value in report.items() if key not in ("arguments", "model_details")}
    assert read_report(write(tmp_path, plain), kind="lm-eval", advice=ADVICE) == plain  # optional fields


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        (
            {"runs": [_run("none", 0.25), _run("yarn:factor=4", 0.5), _run("yarn:factor=4", 0.75)]},
            "runs[2] repeats runs[1], method 'yarn:factor=4'",
        ),
        ({"arguments": {"limit": "10"}}, "'arguments' has a string as 'limit', not null or a number of examples"),
        ({"arguments": {"limit": -1}}, "'arguments' has -1 as 'limit'"),
        ({"arguments": {"limit": True}}, "'arguments' has a boolean as 'limit'"),
        ({"arguments": []}, "the file has a list as 'arguments', not an object"),
        ({"model_details": "org/tiny"}, "the file has a string as 'model_details', not an object"),
        ({"runs": [_run("none", 0.25), "yarn"]}, "runs[1] is a string, not an object"),
        ({"runs": [{**_run("none", 0.25), "results": {"copy": {"acc,none": "high"}}}]}, "runs[0] has scores of 'copy'"),
        ({"max_length": "256"}, "the file has a string as 'max_length', not an integer"),
    ],
    ids=["repeated-method", "limit-string", "limit-negative", "limit-bool", "arguments-list", "details-string",
         "run-string", "score-string", "max-length-string"],
)  # fmt: skip
def test_a_malformed_file_is_one_error_naming_the_file_and_the_problem(tmp_path, changes, problem):
    path = write(tmp_path, lm_eval_json(**changes))
    with pytest.raises(ValueError, match="malformed") as error:
        read_report(path, kind="lm-eval", advice=ADVICE)
    assert str(error.value).startswith(f"{path} is malformed: {problem}") and str(error.value).endswith(f"; {ADVICE}.")


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        (
            {"runs": [_run("none", 0.25), _run("yarn:factor=4", 0.5), _run("yarn:factor=4", 0.75)]},
            "runs[2] repeats runs[1], method 'yarn:factor=4'",
        ),
        ({"arguments": {"limit": "10"}}, "'arguments' has a string as 'limit'"),
        ({"arguments": []}, "the file has a list as 'arguments', not an object"),
    ],
    ids=["repeated-method", "limit-string", "arguments-list"],
)
def test_the_card_refuses_a_malformed_file_before_reading_it(tmp_path, changes, problem):
    """A method run twice (the last run would win silently), a string limit (a TypeError in the card's template), a
    list of arguments (the card's note on the limit dropped): each is the reader's one ValueError."""
    from hf_posenc.hub.card import load_lm_eval_table
    from hf_posenc.record import PatchRecord

    record = PatchRecord("yarn", dict(YARN), native=True)
    assert load_lm_eval_table(write(tmp_path, lm_eval_json()), record).limit == 0.5
    path = write(tmp_path, lm_eval_json(**changes))
    with pytest.raises(ValueError, match="malformed") as error:
        load_lm_eval_table(path, record)
    assert str(error.value).startswith(f"{path} is malformed: {problem}")
