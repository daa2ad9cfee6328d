"""The ranking of a tune from a perplexity run's rows, on rows written by hand: a failed candidate is listed, not
fatal; candidates tied with the best come right after it; each regression carries its paired error."""

from __future__ import annotations

import math

import pytest

from hf_posenc.reports.runs import PerplexityReport
from hf_posenc.spec import MethodSpec
from hf_posenc.tuning.ranking import rank
from hf_posenc.tuning.space import Candidate
from hf_posenc.tuning.statistics import paired_difference

TOKENS = 100  # per block, 4 blocks


def _row(method, length, block_means):
    blocks = [[None if m is None else m * TOKENS, TOKENS] for m in block_means]
    finite = all(m is not None for m in block_means)
    nll = sum(block_means) / len(block_means) if finite else math.nan
    return {
        "method": method,
        "length": length,
        "ppl": math.exp(nll),
        "nll": nll,
        "tokens": 4 * TOKENS,
        "blocks": blocks,
    }


def _report(rows):
    return PerplexityReport.from_json({"protocol": "truncate", "model": "m", "dataset": "d", "results": rows})


def _candidates(*texts):
    return [Candidate(MethodSpec.parse(text), text.split(":")[0]) for text in texts]


SHORT = [2.0, 2.2, 1.8, 2.0]


def test_a_candidate_without_a_finite_loss_is_listed_last_not_fatal():
    rows = [_row("none", 16, SHORT), _row("none", 128, [3.0] * 4)]
    rows += [_row("rerope", 16, SHORT), _row("rerope", 128, [2.5, 2.6, 2.4, 2.5])]
    rows += [_row("dca", 16, SHORT), _row("dca", 128, [2.5, None, 2.4, 2.5])]
    ranked = rank(_report(rows), _candidates("rerope", "dca"), 128, [16], 0.03)
    assert [(r.method, r.rank, r.eligible) for r in ranked] == [("rerope", 1, True), ("dca", None, False)]
    assert math.isnan(ranked[1].nll) and math.isnan(ranked[1].error)


def test_candidates_tied_with_the_best_come_right_after_it():
    """A candidate just behind the best on every block is not tied; one farther behind on average, but noisily, is."""
    best = [2.0, 2.1, 1.9, 2.0]
    steady = [m + 0.01 for m in best]  # 0.01 behind, paired error 0
    noisy = [m + d for m, d in zip(best, [0.3, -0.2, 0.25, -0.25], strict=True)]  # 0.025 behind, error ~0.13
    rows = [_row("none", 16, SHORT)]
    for method, means in [("rerope", best), ("dca", steady), ("yarn:factor=2", noisy)]:
        rows += [_row(method, 16, SHORT), _row(method, 128, means)]
    ranked = rank(_report(rows), _candidates("dca", "yarn:factor=2", "rerope"), 128, [16], 0.03)
    assert [(r.method, r.rank, r.tied) for r in ranked] == [
        ("rerope", 1, False), ("yarn:factor=2", 1, True), ("dca", 3, False),
    ]  # fmt: skip
    assert ranked[2].difference == pytest.approx(0.01) and ranked[2].difference_error == pytest.approx(0, abs=1e-12)


def test_each_regression_is_a_ratio_with_its_paired_error():
    worse = [m + d for m, d in zip(SHORT, [0.05, 0.02, 0.03, 0.02], strict=True)]
    rows = [_row("none", 16, SHORT), _row("ntk:factor=2", 16, worse), _row("ntk:factor=2", 128, [2.5] * 4)]
    (row,) = rank(_report(rows), _candidates("ntk:factor=2"), 128, [16], 0.03)
    difference = paired_difference([[m * TOKENS, TOKENS] for m in worse], [[m * TOKENS, TOKENS] for m in SHORT])
    assert row.regression[16] == pytest.approx(math.exp(0.03))
    assert row.regression_error[16] == pytest.approx(math.exp(0.03) * difference.error)
    assert row.eligible is False and row.rank is None  # 3.05% > 3%
