"""Batch-means standard errors and paired differences, against the formulas written out."""

from __future__ import annotations

import math
import random

import pytest

from hf_posenc.tuning.statistics import nll_estimate, paired_difference, tied


def test_equal_blocks_give_the_textbook_standard_error():
    """Blocks of equal size: the mean of the block means, and their sample deviation over sqrt(B)."""
    rng = random.Random(0)
    means = [2.0 + rng.gauss(0, 0.3) for _ in range(8)]
    estimate = nll_estimate([[m * 100, 100] for m in means])
    mean = sum(means) / 8
    deviation = math.sqrt(sum((m - mean) ** 2 for m in means) / 7)
    assert estimate.mean == pytest.approx(mean, rel=1e-12)
    assert estimate.error == pytest.approx(deviation / math.sqrt(8), rel=1e-12)


def test_uneven_blocks_are_token_weighted():
    blocks = [[30.0, 10], [90.0, 30], [20.0, 5]]
    estimate = nll_estimate(blocks)
    assert estimate.mean == pytest.approx(140 / 45)
    spread = sum(n * n * (s / n - 140 / 45) ** 2 for s, n in blocks)
    assert estimate.error == pytest.approx(math.sqrt(3 / 2 * spread) / 45)
    assert math.isnan(nll_estimate([[30.0, 10]]).error)


def test_a_shift_shared_by_every_block_is_no_tie_however_noisy_the_text():
    """Two candidates on the same text: the text's spread cancels in the paired difference."""
    rng = random.Random(1)
    text = [rng.gauss(3.0, 1.0) for _ in range(16)]
    first = [[(t + 0.01) * 50, 50] for t in text]
    second = [[t * 50, 50] for t in text]
    assert nll_estimate(first).error > 0.2  # far larger than the difference
    difference = paired_difference(first, second)
    assert difference.mean == pytest.approx(0.01) and difference.error < 1e-9
    assert not tied(difference)
    noisy = [[(t + 0.05 * (-1) ** i + 0.001) * 50, 50] for i, t in enumerate(text)]  # a shift within the noise
    assert tied(paired_difference(noisy, second))
    with pytest.raises(ValueError, match="same windows"):
        paired_difference(first, second[:-1] + [[1.0, 49]])
