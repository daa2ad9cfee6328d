"""The spread of a perplexity, and whether two candidates differ by more than it: batch means over blocks.

A window's scored tokens are cut into contiguous blocks (:func:`~hf_posenc.eval.scoring.block_sums`); the tokens of
one document are correlated, blocks of hundreds of them nearly are not. The token-weighted mean NLL is
``sum(s_b) / sum(n_b)``; its standard error, the ratio estimator's over blocks,

    se = sqrt(B / (B - 1) * sum(n_b^2 (m_b - m)^2)) / sum(n_b),    m_b = s_b / n_b.

Two candidates scored on the same windows are compared block by block (paired): the difference of their mean NLLs
and its standard error from the blocks' differences, far smaller than either's own spread when the text, not the
method, makes most of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z = 2.0  # two standard errors: a difference within it is a tie (about 95% two-sided)


@dataclass(frozen=True)
class Estimate:
    """A mean NLL (nats per token) and its standard error; ``error`` is NaN with fewer than two blocks."""

    mean: float
    error: float


def _weighted(values: Sequence[float], weights: Sequence[int]) -> Estimate:
    """The weighted mean of ``values`` and its batch-means standard error (the formula of the module docstring)."""
    total = sum(weights)
    mean = sum(w * v for v, w in zip(values, weights, strict=True)) / total
    count = len(values)
    if count < 2:
        return Estimate(mean, math.nan)
    spread = sum(w * w * (v - mean) ** 2 for v, w in zip(values, weights, strict=True))
    return Estimate(mean, math.sqrt(count / (count - 1) * spread) / total)


def nll_estimate(blocks: Sequence[Sequence[float]]) -> Estimate:
    """The mean NLL of ``[summed NLL, tokens]`` blocks, and its standard error."""
    return _weighted([s / n for s, n in blocks], [int(n) for _, n in blocks])


def paired_difference(first: Sequence[Sequence[float]], second: Sequence[Sequence[float]]) -> Estimate:
    """The mean NLL of ``first`` less that of ``second``, blocks of the same tokens, and its standard error.

    Raises:
        ValueError: the blocks do not hold the same token counts (not the same windows).
    """
    if [int(n) for _, n in first] != [int(n) for _, n in second]:
        raise ValueError("Paired blocks must cover the same tokens: the two were not scored on the same windows.")
    return _weighted([(a - b) / n for (a, n), (b, _) in zip(first, second, strict=True)], [int(n) for _, n in first])


def tied(difference: Estimate) -> bool:
    """Whether a paired difference is within :data:`Z` standard errors of zero (no error known: only an exact
    tie)."""
    if math.isnan(difference.error):
        return difference.mean == 0
    return abs(difference.mean) <= Z * difference.error
