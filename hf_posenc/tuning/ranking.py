"""A tune's candidates ranked from its perplexity run's rows (pure: no model).

Each candidate's regression inside ``L`` is its perplexity against the unpatched model's on the same windows,
``exp(nll - nll_none)``, with the paired standard error of the NLL difference carried through the exponential
(``ratio * se``). The eligible candidates (every regression within ``max_regression``) are ordered by NLL at ``T``:
the best first, then those tied with it (within :data:`~hf_posenc.tuning.statistics.Z` paired standard errors), then
the others; the candidates past ``max_regression`` or without a finite loss follow, by NLL.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..reports.runs import PerplexityReport, PerplexityRow
from ..reports.tune_report import TuneRow
from ..spec import NONE_METHOD
from .space import Candidate
from .statistics import Estimate, nll_estimate, paired_difference, tied


def _finite_blocks(row: PerplexityRow) -> list | None:
    """``row``'s blocks, or None where it has none or one is not finite (a numerical failure)."""
    blocks = row.blocks
    if not blocks or any(value is None or not math.isfinite(value) for value, _ in blocks):
        return None
    return blocks


def _paired(first: PerplexityRow, second: PerplexityRow) -> Estimate | None:
    """The paired NLL difference of two rows of the same windows, or None where a block is missing."""
    mine, theirs = _finite_blocks(first), _finite_blocks(second)
    return None if mine is None or theirs is None else paired_difference(mine, theirs)


def _row(report: PerplexityReport, method: str, length: int) -> PerplexityRow:
    return next(row for row in report.results if (row.method, row.length) == (method, length))


@dataclass(frozen=True)
class _Scored:
    candidate: Candidate
    row: PerplexityRow  # at the target
    regression: dict[str, float]
    regression_error: dict[str, float]
    eligible: bool

    @property
    def nll(self) -> float:
        """The NLL at the target; NaN sorts last."""
        return math.inf if math.isnan(self.row.nll) else self.row.nll


def _score(
    report: PerplexityReport, candidate: Candidate, target: int, short: Sequence[int], max_regression: float
) -> _Scored:
    regression, errors = {}, {}
    for n in short:
        mine, unpatched = _row(report, candidate.text, n), _row(report, NONE_METHOD, n)
        ratio = math.exp(mine.nll - unpatched.nll) if math.isfinite(mine.nll - unpatched.nll) else math.nan
        pair = _paired(mine, unpatched)
        regression[n], errors[n] = ratio, math.nan if pair is None else ratio * pair.error
    row = _row(report, candidate.text, target)
    eligible = math.isfinite(row.nll) and all(ratio <= 1 + max_regression for ratio in regression.values())
    return _Scored(candidate, row, regression, errors, eligible)


def rank(
    report: PerplexityReport,
    candidates: Sequence[Candidate],
    target: int,
    short: Sequence[int],
    max_regression: float,
) -> list[TuneRow]:
    """The candidates' rows of ``report`` as ranked :class:`~hf_posenc.reports.tune_report.TuneRow` s (the order of the
    module's docstring): rank 1 for the best and every candidate tied with it, else the place; None where not
    eligible."""
    scored = [_score(report, candidate, target, short, max_regression) for candidate in candidates]
    eligible = sorted((item for item in scored if item.eligible), key=lambda item: item.nll)
    rest = sorted((item for item in scored if not item.eligible), key=lambda item: item.nll)
    best = eligible[0] if eligible else None
    differences = {item.candidate.text: _paired(item.row, best.row) for item in eligible[1:]}
    level = [
        item for item in eligible[1:] if differences[item.candidate.text] and tied(differences[item.candidate.text])
    ]
    behind = [item for item in eligible[1:] if item not in level]
    rows = []
    for place, item in enumerate([*eligible[:1], *level, *behind, *rest], start=1):
        difference = differences.get(item.candidate.text)
        within = item in level
        spread = nll_estimate(_finite_blocks(item.row) or [[item.row.nll * item.row.tokens, item.row.tokens]])
        rows.append(
            TuneRow(
                method=item.candidate.text,
                family=item.candidate.family,
                ppl=item.row.ppl,
                nll=item.row.nll,
                error=spread.error,
                difference=math.nan if difference is None else difference.mean,
                difference_error=math.nan if difference is None else difference.error,
                regression=item.regression,
                regression_error=item.regression_error,
                eligible=item.eligible,
                rank=(1 if within or item is best else place) if item.eligible else None,
                tied=within,
            )
        )
    return rows
