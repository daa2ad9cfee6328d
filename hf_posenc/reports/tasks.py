"""What an lm-evaluation-harness run reports, typed: the value :func:`~hf_posenc.eval.run_lm_eval` returns and its
``lm_eval.json`` read back, and the table ``hf-posenc lm-eval`` prints (tasks and metrics as rows, methods as
columns).

The report is the file field for field: ``to_json`` gives the object ``lm_eval.json`` holds, ``from_json`` reads
one, and ``read`` a file, checked first (:func:`~hf_posenc.reports.schema.read_report`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..spec import MethodSpec
from .schema import known_fields, read_report

LM_EVAL_JSON = "lm_eval.json"  # the results file of ``hf-posenc lm-eval``
_RENAMED = {"n_shot": "n-shot", "n_samples": "n-samples"}  # field -> lm-eval's key, kept in the file


@dataclass(frozen=True)
class LmEvalRun:
    """One method's lm-eval results: per task (and group) its metrics as lm-eval names them (``acc,none``,
    ``acc_stderr,none``; null where not computed or not finite), and what defines the tasks.

    Attributes:
        method (`str`): the method spec (``"none"``: unpatched).
        params (`dict`): its parameters as resolved on the model.
        results (`dict`): task -> metric -> value.
        groups (`list[str]`): the task groups run.
        configs (`list[str]`): the tasks whose configs ran.
        versions (`dict`): each task's version.
        n_shot (`dict`): each task's few-shot count (``n-shot`` in the file).
        n_samples (`dict`): each task's sample counts (``n-samples`` in the file).
        higher_is_better (`dict`): per task, each metric's direction.
    """

    method: str
    params: dict[str, Any]
    results: dict[str, dict[str, float | None]]
    groups: list[str] = field(default_factory=list)
    configs: list[str] = field(default_factory=list)
    versions: dict[str, Any] = field(default_factory=dict)
    n_shot: dict[str, Any] = field(default_factory=dict)
    n_samples: dict[str, Any] = field(default_factory=dict)
    higher_is_better: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of_results(cls, spec: MethodSpec, params: Mapping[str, Any], results: Mapping[str, Any]) -> LmEvalRun:
        """What the report keeps of :func:`lm_eval.simple_evaluate`'s ``results`` for ``spec``."""
        return cls(
            method=spec.text,
            params=plain_json(dict(params)),
            results={task: _metrics(values) for task, values in results["results"].items()},
            groups=sorted(results.get("groups", {})),
            configs=sorted(results["configs"]),
            **{name: plain_json(results[key]) for name, key in _RENAMED.items()},
            versions=plain_json(results["versions"]),
            higher_is_better=plain_json(results["higher_is_better"]),
        )

    def to_json(self) -> dict[str, Any]:
        return {_RENAMED.get(key, key): value for key, value in dataclasses.asdict(self).items()}

    @classmethod
    def from_json(cls, run: Mapping[str, Any]) -> LmEvalRun:
        renamed = {name: run[key] for name, key in _RENAMED.items() if key in run}
        return cls(**known_fields(cls, {**run, **renamed}))


@dataclass(frozen=True)
class LmEvalReport:
    """``hf-posenc lm-eval``'s ``lm_eval.json``: every method's task scores on one model at one ``max_length``.

    Attributes:
        model (`str`): the model, as labelled.
        lm_eval_version (`str`): the lm-evaluation-harness that ran.
        max_length (`int`): the tokens lm-eval let in, for every method.
        runs (`tuple[LmEvalRun]`): one per method, in the order run.
        model_details (`dict`): the model as loaded: name, file, dtype, revision, commit.
        versions (`dict`): the versions of the packages that ran.
        device (`str`, *optional*): where it ran.
        arguments (`dict`): the tasks and the settings given (secrets redacted).
    """

    model: str
    lm_eval_version: str
    max_length: int
    runs: tuple[LmEvalRun, ...] = ()
    model_details: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    device: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)

    def score(self, method: str, task: str, metric: str) -> float | None:
        """``method``'s value of ``metric`` (``"acc,none"``) on ``task``; None where not run or not computed."""
        run = next((run for run in self.runs if run.method == method), None)
        return None if run is None else run.results.get(task, {}).get(metric)

    def metric_rows(self) -> Iterator[tuple[str, str, list[float | None]]]:
        """``(task, metric, one value per run)`` for every metric but standard errors, in the order lm-eval gives."""
        keys = dict.fromkeys((task, key) for run in self.runs for task, values in run.results.items() for key in values)
        for task, key in keys:
            if "_stderr," not in key:
                yield task, key, [run.results.get(task, {}).get(key) for run in self.runs]

    def table(self) -> str:
        """Tasks and metrics as rows, methods as columns (4 decimals; ``-``: not computed)."""
        header = ["task", "metric", *(run.method for run in self.runs)]
        rows = [
            [task, key, *("-" if v is None else f"{v:.4f}" for v in values)] for task, key, values in self.metric_rows()
        ]
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        return "\n".join(
            "  ".join(
                cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
            for row in [header, *rows]
        )

    def to_json(self) -> dict[str, Any]:
        """The file's object, its keys in the file's order (the run's details first, the runs last)."""
        order = ("model", "model_details", "lm_eval_version", "versions", "device", "max_length", "arguments")
        report = {name: getattr(self, name) for name in order}
        return plain_json({**report, "runs": [run.to_json() for run in self.runs]})

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LmEvalReport:
        runs = tuple(LmEvalRun.from_json(run) for run in data["runs"])
        return cls(**{**known_fields(cls, data), "runs": runs})

    @classmethod
    def read(cls, path: str | Path) -> LmEvalReport:
        """The report in ``path`` (an ``lm_eval.json``); ``ValueError`` naming the file and field where malformed."""
        return cls.from_json(read_report(Path(path), kind="lm-eval", advice="it is no lm_eval.json of lm-eval"))


def _metrics(values: Mapping[str, Any]) -> dict[str, float | None]:
    """The metrics of one task (``metric,filter`` keys: not the alias, name or sample count) as floats or None."""
    return {
        key: float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        for key, value in values.items()
        if "," in key
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
