"""Reading results files back (``results.json``, ``passkey.json``, ``lm_eval.json``): one check of their shape,
before use.

A run that resumes, and a model card that shows results, read a file someone may have edited, cut or
replaced. Everything they read is checked here first, so a malformed file is a one-line ``ValueError``
naming the file and the field, and nothing is written on the way to it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any

_NUMBER = (int, float)
# field -> the JSON types it may hold (bool is no number here); None in a tuple: the field may be null
PERPLEXITY_FILE = {
    "protocol": (str,),
    "model": (str,),
    "dataset": (str,),
    "results": (list,),
    "dataset_details": (dict,),
}
PERPLEXITY_ROW = {
    "method": (str,),
    "length": (int,),
    "ppl": (*_NUMBER, type(None)),
    "nll": (*_NUMBER, type(None)),
    "tokens": (int,),
}
# Fields a row may leave out (a results file made by hand or by another program), checked where present; None: the
# field may be null.
PERPLEXITY_ROW_OPTIONAL = {
    "windows": (int,),
    "documents": (int,),
    "skipped_documents": (int,),
    "dropped_tokens": (int,),
    "forwards": (int,),
    "derived_from": (int, type(None)),
    "seconds": _NUMBER,
    "blocks": (list,),
}
MAX_LENGTH = 2**40  # tokens: no window is longer; a longer length is an edited or damaged file
# A row whose perplexity is not a finite number says so in its file as null plus a ``status`` (standard JSON has no
# NaN or Infinity); read back, the floats are restored: ``nan`` -> NLL and PPL NaN (a numerical failure),
# ``overflow`` -> PPL +inf (exp(NLL) past the float range; a null NLL is +inf too).
ROW_STATUSES = ("nan", "overflow")
DATASET_DETAILS = {"documents": (int,), "tokens": (int,)}
# what a run that resumes reads besides (it writes the previous report again, and prints it)
RUN_FIELDS = {"protocol_details": (dict,), "model_details": (dict,)}
RUN_DETAILS = {"protocol_details": {"bos": (bool,)}, "model_details": {"dtype": (str,), "trained_context": (int,)}}
MODEL_DETAILS_OPTIONAL = {"fingerprint": (str,), "trained_context": (int,)}  # where present
PASSKEY_FILE = {"model": (str,), "trials": (list,), "accuracy": (list,)}
PASSKEY_FILE_OPTIONAL = {"prompt_hashes": (dict,), "bos": (bool,)}
PASSKEY_TRIAL = {"method": (str,), "length": (int,), "depth": _NUMBER, "correct": (bool,)}
PASSKEY_CELL = {"method": (str,), "length": (int,), "depth": _NUMBER, "accuracy": _NUMBER, "trials": (int,)}
LM_EVAL_FILE = {"model": (str,), "lm_eval_version": (str,), "max_length": (int,), "runs": (list,)}
LM_EVAL_FILE_OPTIONAL = {"arguments": (dict,), "model_details": (dict,)}  # what a card reads of them, where present
LM_EVAL_RUN = {"method": (str,), "params": (dict,), "results": (dict,)}


def known_fields(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``data`` (a file's object) that are fields of the dataclass ``cls``: a typed report is built
    from what its file holds of it."""
    names = {item.name for item in dataclasses.fields(cls)}
    return {key: value for key, value in data.items() if key in names}


def read_report(path: Path, *, kind: str, advice: str) -> dict[str, Any]:
    """The checked contents of the results file ``path``.

    Args:
        path (`Path`): the file.
        kind (`str`): ``"perplexity"`` (``hf-posenc eval``'s results.json), ``"passkey"`` (passkey.json),
            ``"lm-eval"`` (``hf-posenc lm-eval``'s lm_eval.json) or ``"tune"`` (tune.json).
        advice (`str`): what the reader can do, ending the error message.

    Raises:
        ValueError: not JSON, not an object, a field missing or of the wrong type (named), or rows that repeat
            one another (a method at a length; an lm-eval method).
    """
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not a results file (not UTF-8 text: {error.reason}); {advice}.") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not a results file (not JSON: {error}); {advice}.") from None
    except RecursionError:
        raise ValueError(f"{path} is not a results file (nested too deep to read); {advice}.") from None
    if not isinstance(report, dict):
        raise ValueError(f"{path} is not a results file (a JSON {type(report).__name__}, not an object); {advice}.")
    problem = _PROBLEMS[kind](report)
    if problem:
        raise ValueError(f"{path} is malformed: {problem}; {advice}.")
    if kind == "perplexity":
        report["results"] = [_from_file(row) for row in report["results"]]
    return report


def row_status(row: dict[str, Any]) -> str | None:
    """``"nan"``, ``"overflow"`` or None (a finite perplexity) for a results row as computed."""
    if math.isnan(row["nll"]) or math.isnan(row["ppl"]):
        return "nan"
    return "overflow" if math.isinf(row["ppl"]) else None


def report_for_file(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` with each results row whose perplexity is not finite marked with its ``status`` (the values
    themselves become null when written, :func:`hf_posenc.files.json_text`)."""
    rows = report.get("results")
    if not isinstance(rows, list):
        return report
    marked = [{**row, "status": status} if (status := row_status(row)) else row for row in rows]
    return {**report, "results": marked}


def _from_file(row: dict[str, Any]) -> dict[str, Any]:
    status = row.get("status")
    if status == "nan":
        return {**row, "nll": math.nan, "ppl": math.nan}
    if status == "overflow":
        return {**row, "nll": math.inf if row["nll"] is None else row["nll"], "ppl": math.inf}
    return row


def _status_problem(rows: list[dict[str, Any]]) -> str | None:
    for i, row in enumerate(rows):
        status = row.get("status")
        if status is not None and status not in ROW_STATUSES:
            return f"results[{i}] has status {status!r}, not one of {', '.join(ROW_STATUSES)}"
        if status is None and (row["ppl"] is None or row["nll"] is None):
            return f"results[{i}] has null as 'ppl' or 'nll' without a 'status' saying why"
    return None


def _perplexity_problem(report: dict[str, Any]) -> str | None:
    return (
        fields_problem(report, PERPLEXITY_FILE, "the file")
        or fields_problem(report["dataset_details"], DATASET_DETAILS, "'dataset_details'")
        or _rows_problem(report["results"], PERPLEXITY_ROW, "results")
        or _optional_problem(report["results"], PERPLEXITY_ROW_OPTIONAL, "results")
        or _values_problem(report["results"])
        or _repeats_problem(
            report["results"],
            "results",
            lambda row: (row["method"], row["length"]),
            lambda row: f"{row['method']!r} at length {row['length']}",
        )
        or _params_problem(report["results"])
        or _status_problem(report["results"])
        or _hashes_problem(report["dataset_details"].get("document_hashes"))
        or _model_details_problem(report.get("model_details"))
    )


def _model_details_problem(details: Any) -> str | None:
    """The optional fields a ``model_details`` object has, checked (its required ones, where a resume needs them:
    ``RUN_DETAILS``)."""
    if not isinstance(details, dict):
        return None if details is None else f"the file has {_json_name(details)} as 'model_details', not an object"
    return fields_problem(details, _present(MODEL_DETAILS_OPTIONAL, details), "'model_details'")


def _hashes_problem(hashes: Any) -> str | None:
    if hashes is None or isinstance(hashes, list) and all(isinstance(item, str) for item in hashes):
        return None
    return "'dataset_details' has 'document_hashes' that are not a list of strings"


def _passkey_problem(report: dict[str, Any]) -> str | None:
    return (
        fields_problem(report, PASSKEY_FILE, "the file")
        or fields_problem(report, _present(PASSKEY_FILE_OPTIONAL, report), "the file")
        or _hash_map_problem(report.get("prompt_hashes"))
        or _model_details_problem(report.get("model_details"))
        or _rows_problem(report["trials"], PASSKEY_TRIAL, "trials")
        or _rows_problem(report["accuracy"], PASSKEY_CELL, "accuracy")
        or _passkey_cells_problem(report["trials"], report["accuracy"])
    )


def _passkey_cells_problem(trials: list[dict[str, Any]], cells: list[dict[str, Any]]) -> str | None:
    """A depth that is no fraction of the prompt (0 to 1), or accuracy cells that are not the trials' (one per
    method, length and depth, each with as many trials as the rows there and their share correct): a file edited
    so would be scored wrong, or written back as read."""
    groups: dict[tuple, list[bool]] = {}
    for i, trial in enumerate(trials):
        if not 0 <= trial["depth"] <= 1:
            return f"trials[{i}] has depth {trial['depth']!r}, not a fraction of the prompt from 0 to 1"
        groups.setdefault((trial["method"], trial["length"], trial["depth"]), []).append(trial["correct"])
    seen: dict[tuple, int] = {}
    for i, cell in enumerate(cells):
        key = (cell["method"], cell["length"], cell["depth"])
        said = f"{key[0]!r} at {key[1]} tokens, depth {key[2]}"
        if key in seen:
            return f"accuracy[{i}] repeats accuracy[{seen[key]}], {said}"
        seen[key] = i
        correct = groups.get(key, [])
        if cell["trials"] != len(correct) or not correct or cell["accuracy"] != sum(correct) / len(correct):
            return f"accuracy[{i}] ({said}) is not the share correct of its {len(correct)} trials"
    missing = next((key for key in groups if key not in seen), None)
    return None if missing is None else f"the trials of {missing[0]!r} at {missing[1]} tokens have no accuracy cell"


def _lm_eval_problem(report: dict[str, Any]) -> str | None:
    problem = fields_problem(report, LM_EVAL_FILE, "the file") or fields_problem(
        report, _present(LM_EVAL_FILE_OPTIONAL, report), "the file"
    )
    if problem:
        return problem
    runs = report["runs"]
    problems = (_lm_eval_run_problem(run, f"runs[{i}]") for i, run in enumerate(runs))
    return (
        next((p for p in problems if p), None)
        or _repeats_problem(runs, "runs", lambda run: run["method"], lambda run: f"method {run['method']!r}")
        or _limit_problem(report)
    )


def _lm_eval_run_problem(run: Any, where: str) -> str | None:
    """A run that is no object, lacks a field, or has a score that is no number (nor null)."""
    if not isinstance(run, dict):
        return f"{where} is {_json_name(run)}, not an object"
    problem = fields_problem(run, LM_EVAL_RUN, where)
    for task, scores in ({} if problem else run["results"]).items():
        numbers = isinstance(scores, dict) and all(value is None or _is_number(value) for value in scores.values())
        problem = problem or (None if numbers else f"{where} has scores of {task!r} that are not numbers or null")
    return problem


def _limit_problem(report: dict[str, Any]) -> str | None:
    """lm-eval's ``limit``, where the arguments give one: a count of examples, or a fraction of them below 1."""
    limit = report.get("arguments", {}).get("limit")
    if limit is None or _is_number(limit) and 0 < limit < math.inf:
        return None
    shown = repr(limit) if _is_number(limit) else _json_name(limit)
    return f"'arguments' has {shown} as 'limit', not null or a number of examples above 0 (below 1: a fraction)"


def _is_number(value: Any) -> bool:
    return isinstance(value, _NUMBER) and not isinstance(value, bool)


def fields_problem(entry: dict[str, Any], fields: dict[str, tuple], where: str) -> str | None:
    """What is wrong with ``entry``'s ``fields`` (missing, null, wrong type), or None. ``where`` names
    ``entry`` in the message (``"the file"``, ``"results[3]"``)."""
    for key, types in fields.items():
        if key not in entry:
            return f"{where} has no {key!r}"
        value = entry[key]
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            names = " or ".join(_JSON_NAMES[kind] for kind in types)
            return f"{where} has {_json_name(value)} as {key!r}, not {names}"
    return None


def _rows_problem(rows: list[Any], fields: dict[str, tuple], name: str) -> str | None:
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            return f"{name}[{i}] is {_json_name(row)}, not an object"
        problem = fields_problem(row, fields, f"{name}[{i}]")
        if problem:
            return problem
        if row.get("length", 1) <= 0:
            return f"{name}[{i}] has length {row['length']}, not a positive number of tokens"
        if row.get("length", 1) > MAX_LENGTH:
            return f"{name}[{i}] has length {row['length']}, more tokens than any window (2**40)"
    return None


def _present(fields: dict[str, tuple], entry: dict[str, Any]) -> dict[str, tuple]:
    """The optional ``fields`` that ``entry`` has, to check with :func:`fields_problem`."""
    return {key: types for key, types in fields.items() if key in entry}


def _optional_problem(rows: list[dict[str, Any]], fields: dict[str, tuple], name: str) -> str | None:
    """:func:`fields_problem` for the optional ``fields`` each row has."""
    for i, row in enumerate(rows):
        problem = fields_problem(row, _present(fields, row), f"{name}[{i}]")
        if problem:
            return problem
    return None


def _values_problem(rows: list[dict[str, Any]]) -> str | None:
    """Counts that are negative, an NLL below 0 or a perplexity below 1 (``exp`` of a mean of NLLs >= 0), a row
    derived from a length that is not longer."""
    for i, row in enumerate(rows):
        for key in ("tokens", "windows", "documents", "skipped_documents", "dropped_tokens", "forwards"):
            if row.get(key, 0) < 0:
                return f"results[{i}] has {key} {row[key]}, below 0"
        if row.get("seconds", 0) < 0 or not math.isfinite(row.get("seconds", 0)):
            return f"results[{i}] has seconds {row['seconds']}, not a finite time"
        nll, ppl = row["nll"], row["ppl"]  # null with a status, or bare NaN and infinity as Python's json writes
        if nll is not None and math.isfinite(nll) and nll < 0:
            return f"results[{i}] has nll {nll}, below 0"
        if ppl is not None and math.isfinite(ppl) and ppl < 1:
            return f"results[{i}] has ppl {ppl}, below 1"
        source = row.get("derived_from")
        if source is not None and not row["length"] < source <= MAX_LENGTH:
            return f"results[{i}] has derived_from {source}, not a length above its own {row['length']}"
    return None


def _repeats_problem(
    rows: list[dict[str, Any]],
    name: str,
    key: Callable[[dict[str, Any]], Hashable],
    said: Callable[[dict[str, Any]], str],
) -> str | None:
    """Two of ``rows`` with the same ``key`` (a method at a length, an lm-eval method): which one a resume keeps, a
    card shows, would be a guess. ``said`` names the key in the message."""
    first: dict[Hashable, int] = {}
    for i, row in enumerate(rows):
        j = first.setdefault(key(row), i)
        if j != i:
            return f"{name}[{i}] repeats {name}[{j}], {said(row)}"
    return None


def _hash_map_problem(hashes: Any) -> str | None:
    if hashes is None or all(isinstance(k, str) and isinstance(v, str) for k, v in hashes.items()):
        return None
    return "the file has 'prompt_hashes' that are not an object of strings"


def _params_problem(rows: list[dict[str, Any]]) -> str | None:
    for i, row in enumerate(rows):
        if row.get("params") is not None and not isinstance(row["params"], dict):
            return f"results[{i}] has {_json_name(row['params'])} as 'params', not an object"
    return None


TUNE_FILE = {
    "model": (str,),
    "dataset": (str,),
    "trained_context": (int,),
    "target_length": (int,),
    "short_lengths": (list,),
    "max_regression": _NUMBER,
    "reference": (dict,),
    "rows": (list,),
}
TUNE_ROW = {"method": (str,), "family": (str,), "regression": (dict,), "eligible": (bool,), "tied": (bool,)}


def _tune_problem(report: dict[str, Any]) -> str | None:
    problem = fields_problem(report, TUNE_FILE, "the file")
    rows = [] if problem else report["rows"]
    problems = (
        f"rows[{i}] is not an object" if not isinstance(row, dict) else fields_problem(row, TUNE_ROW, f"rows[{i}]")
        for i, row in enumerate(rows)
    )
    return problem or next((p for p in problems if p), None)


_PROBLEMS = {
    "perplexity": _perplexity_problem,
    "passkey": _passkey_problem,
    "lm-eval": _lm_eval_problem,
    "tune": _tune_problem,
}
_JSON_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    list: "a list",
    dict: "an object",
    bool: "a boolean",
    type(None): "null (with a 'status')",
}


def _json_name(value: Any) -> str:
    if value is None:
        return "null"
    return _JSON_NAMES.get(type(value), type(value).__name__)
