"""What ``hf-posenc tune`` reports, typed: every candidate's scores, ranked, and the winner.

``tune.json`` is :meth:`TuneReport.to_json`; ``tune.csv`` one line a candidate (:meth:`TuneReport.csv_rows`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..files import json_safe
from ..spec import MethodSpec
from .schema import known_fields, read_report

TUNE_JSON = "tune.json"
TUNE_CSV = "tune.csv"
CSV_COLUMNS = ("rank", "method", "family", "ppl", "nll", "error", "worst_regression", "eligible", "tied", "passkey")


@dataclass(frozen=True)
class TuneRow:
    """One candidate's scores.

    Attributes:
        method (`str`): the method spec (``"yarn:factor=2.0"``).
        family (`str`): its family (``"yarn+logn"`` with log-n).
        ppl (`float`): perplexity at the target length (truncate, token-weighted).
        nll (`float`): the mean NLL there, nats per token.
        error (`float`): the standard error of ``nll`` over blocks of tokens (NaN with one block).
        difference (`float`): ``nll`` less the best candidate's, on the same tokens.
        difference_error (`float`): the paired standard error of ``difference``.
        regression (`dict[int, float]`): at each length inside the trained context, the perplexity against the
            unpatched model's on the same windows (1.02: 2% worse).
        regression_error (`dict[int, float]`): the standard error of each regression (paired, over blocks).
        eligible (`bool`): every regression within the tune's ``max_regression``, and a finite loss at the target.
        rank (`int`, *optional*): 1 for the best and every candidate tied with it (within
            :data:`~hf_posenc.tuning.statistics.Z` paired standard errors), else its place; None where not eligible.
        tied (`bool`): within noise of the best: reported as tied, not ranked below it.
        passkey (`float`, *optional*): the passkey accuracy at the target (a tune with passkey trials).
        passkey_trials (`int`, *optional*): the prompts it is over.
    """

    method: str
    family: str
    ppl: float
    nll: float
    error: float
    difference: float
    difference_error: float
    regression: dict[int, float]
    regression_error: dict[int, float]
    eligible: bool
    rank: int | None = None
    tied: bool = False
    passkey: float | None = None
    passkey_trials: int | None = None

    @property
    def passkey_error(self) -> float | None:
        """The binomial standard error of ``passkey``, ``sqrt(p (1 - p) / n)``."""
        if self.passkey is None or not self.passkey_trials:
            return None
        return math.sqrt(self.passkey * (1 - self.passkey) / self.passkey_trials)

    @property
    def worst(self) -> int | None:
        """The length of the largest regression; None without one."""
        values = self.regression
        return max(values, key=lambda key: math.inf if math.isnan(values[key]) else values[key], default=None)

    @property
    def worst_regression(self) -> float:
        """The largest perplexity ratio against the unpatched model inside the trained context (NaN: not finite)."""
        return 1.0 if self.worst is None else self.regression[self.worst]

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> TuneRow:
        values = {key: (math.nan if value is None else value) for key, value in known_fields(cls, row).items()}
        for key in ("regression", "regression_error"):  # a file holds null for a ratio that is not finite
            values[key] = {int(n): (math.nan if v is None else v) for n, v in (row.get(key) or {}).items()}
        return cls(**{**values, **{key: row.get(key) for key in ("rank", "passkey", "passkey_trials")}})


@dataclass(frozen=True)
class TuneReport:
    """``tune.json``: the candidates of a tune, best first.

    Attributes:
        model (`str`): the model, as labelled.
        dataset (`str`): the documents, as labelled.
        trained_context (`int`): the model's ``L``.
        target_length (`int`): the length ``T`` the candidates were chosen for and scored at.
        short_lengths (`list[int]`): the lengths inside ``L`` the regression was measured at.
        max_regression (`float`): the largest regression a winner may have (0.03: 3%).
        reference (`dict[int, float]`): the unpatched model's perplexity at each length.
        rows (`tuple[TuneRow]`): the candidates measured: eligible ones by rank, then the others.
        screened_out (`list[str]`): candidates a budget left out after screening.
        screening_length (`int`, *optional*): the length screening scored at.
        seconds (`float`, *optional*): the tune's wall time.
    """

    model: str
    dataset: str
    trained_context: int
    target_length: int
    short_lengths: list[int]
    max_regression: float
    reference: dict[int, float]
    rows: tuple[TuneRow, ...]
    screened_out: list[str] = field(default_factory=list)
    screening_length: int | None = None
    seconds: float | None = None

    @property
    def best(self) -> MethodSpec | None:
        """The winner: the lowest perplexity at the target among the eligible candidates (None: none is)."""
        winner = next((row for row in self.rows if row.rank == 1 and not row.tied), None)
        return None if winner is None else MethodSpec.parse(winner.method)

    @property
    def tied_with_best(self) -> list[str]:
        """The candidates within noise of the winner."""
        return [row.method for row in self.rows if row.tied]

    def table(self) -> str:
        """The ranked candidates as aligned text: rank (``=1``: tied with the best), perplexity at ``T`` and its
        standard error, the worst regression inside ``L``."""
        width = max([len(row.method) for row in self.rows] + [6])
        head = f"{'rank':>4}  {'method':<{width}}  {f'ppl@{self.target_length}':>12}  {'± se':>7}  {'regression':>16}"
        passkey = any(row.passkey is not None for row in self.rows)
        lines = [head + ("     passkey" if passkey else "")]
        for row in self.rows:
            rank = "-" if row.rank is None else (f"={row.rank}" if row.tied else str(row.rank))
            spread = row.ppl * row.error  # d ppl = ppl d nll
            error = row.regression_error.get(row.worst, math.nan) if row.worst is not None else math.nan
            regression = f"{(row.worst_regression - 1) * 100:+.1f}% ± {error * 100:.1f}"
            note = "" if row.eligible else "  past --max-regression"
            keys = f"  {row.passkey:>5.0%} ± {row.passkey_error:.0%}" if passkey and row.passkey is not None else ""
            line = f"{rank:>4}  {row.method:<{width}}  {row.ppl:>12.3f}  {spread:>7.3f}  {regression:>16}"
            lines.append(line + keys + note)
        return "\n".join(lines)

    def csv_rows(self) -> list[list[Any]]:
        """:data:`CSV_COLUMNS` and one row a candidate."""
        rows: list[list[Any]] = [list(CSV_COLUMNS)]
        for row in self.rows:
            values = [row.rank, row.method, row.family, row.ppl, row.nll, row.error, row.worst_regression]
            rows.append([*values, row.eligible, row.tied, row.passkey])
        return rows

    def to_json(self) -> dict[str, Any]:
        report = {item.name: getattr(self, item.name) for item in dataclasses.fields(self)}
        report["reference"] = _keyed_by_text(self.reference)
        rows = [dataclasses.asdict(row) for row in self.rows]
        for row in rows:  # JSON names its keys in text
            for key in ("regression", "regression_error"):
                row[key] = _keyed_by_text(row[key])
        return {**report, "best": None if self.best is None else self.best.text, "rows": json_safe(rows)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TuneReport:
        rows = tuple(TuneRow.from_json(row) for row in data["rows"])
        reference = {int(n): ppl for n, ppl in data["reference"].items()}
        return cls(**{**known_fields(cls, data), "rows": rows, "reference": reference})

    @classmethod
    def read(cls, path: str | Path) -> TuneReport:
        """The report in ``path`` (a ``tune.json``)."""
        return cls.from_json(read_report(Path(path), kind="tune", advice="it is no tune.json of tune"))


def _keyed_by_text(values: Mapping[int, float]) -> dict[str, float]:
    return {str(length): value for length, value in values.items()}
