"""What ``lm_eval.json`` keeps of lm-eval's results (:mod:`hf_posenc.eval.harness` writes it), and the table of it
``hf-posenc lm-eval`` prints: tasks and metrics as rows, methods as columns."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..spec import MethodSpec

LM_EVAL_JSON = "lm_eval.json"  # the results file of ``hf-posenc lm-eval``


def run_entry(spec: MethodSpec, params: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
    """What ``lm_eval.json`` keeps of one method's lm-eval results: per task (and group) its metrics as lm-eval
    names them (``acc,none``, ``acc_stderr,none``; not computed or not finite: null), and what defines the task."""
    return {
        "method": spec.text,
        "params": params,
        "results": {task: _metrics(values) for task, values in results["results"].items()},
        "groups": sorted(results.get("groups", {})),
        "configs": sorted(results["configs"]),
        "versions": results["versions"],
        "n-shot": results["n-shot"],
        "n-samples": results["n-samples"],
        "higher_is_better": results["higher_is_better"],
    }


def _metrics(values: dict[str, Any]) -> dict[str, float | None]:
    return {
        key: float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        for key, value in values.items()
        if "," in key  # metric,filter: not the alias, name or sample count
    }


def plain_json(value: Any) -> Any:
    """``value`` in JSON's types (numpy numbers as numbers; anything else lm-eval keeps, a function, as text)."""
    if isinstance(value, dict):
        return {str(key): plain_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(item) for item in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return value.item() if hasattr(value, "item") else str(value)


def metric_rows(report: dict[str, Any]) -> Iterator[tuple[str, str, list[float | None]]]:
    """``(task, metric, one value per run)`` for every metric but standard errors, in the order lm-eval gives."""
    runs = report["runs"]
    keys = dict.fromkeys((task, key) for run in runs for task, values in run["results"].items() for key in values)
    for task, key in keys:
        if "_stderr," not in key:
            yield task, key, [run["results"].get(task, {}).get(key) for run in runs]


def format_lm_eval_table(report: dict[str, Any]) -> str:
    """Tasks and metrics as rows, methods as columns (4 decimals; ``-``: not computed)."""
    header = ["task", "metric", *(run["method"] for run in report["runs"])]
    rows = [
        [task, key, *("-" if v is None else f"{v:.4f}" for v in values)] for task, key, values in metric_rows(report)
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in [header, *rows]
    )
