"""The math of the encodings that replace positions: the sinusoidal table (Vaswani et al. 2017, §3.5) and the T5
relative buckets (Raffel et al. 2020, §2.1), each against an independent implementation."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

import hf_posenc
from hf_posenc.methods import alibi_slopes
from hf_posenc.methods.sinusoidal import sinusoidal_embedding
from hf_posenc.methods.t5_bias import bucket_distances, t5_bias_init


@pytest.mark.parametrize(("n", "d"), [(1, 2), (50, 16), (300, 64)])
def test_sinusoidal_table_is_the_papers_formula(n, d):
    """PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / 10000^(2i/d)), written out term by term."""
    table = hf_posenc.sinusoidal_table(n, d)
    assert table.shape == (n, d) and table.dtype == torch.float64
    for p in range(0, n, max(1, n // 7)):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            assert table[p, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-12)
            assert table[p, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-12)


def test_sinusoidal_embedding_at_any_position_matches_the_table_rows():
    """Positions past any table, as a patched GPT-2 looks them up, are the rows a longer table would have."""
    positions = torch.tensor([[0, 5, 4095, 100_000]])
    rows = hf_posenc.sinusoidal_table(100_001, 8)[positions[0]]
    torch.testing.assert_close(sinusoidal_embedding(positions, 8)[0], rows, rtol=0, atol=0)


@pytest.mark.parametrize(("bad", "match"), [({"dim": 7}, "dim must be even"), ({"dim": 0}, "positive integer")])
def test_sinusoidal_bad_width(bad, match):
    with pytest.raises(ValueError, match=match):
        sinusoidal_embedding(torch.arange(3), **bad)


@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (2, 2), (3, 7), (8, 16), (32, 32), (64, 4096)])
def test_t5_buckets_equal_transformers_t5_unidirectional(num_buckets, max_distance):
    """transformers' T5 ``_relative_position_bucket`` (bidirectional=False, relative position = key - query) is
    an independent implementation of the bucketing."""
    distance = torch.cat([torch.arange(0, 5000), torch.tensor([10**6, 2**31 - 1])])
    ours = hf_posenc.t5_buckets(distance, num_buckets=num_buckets, max_distance=max_distance)
    theirs = T5Attention._relative_position_bucket(
        -distance, bidirectional=False, num_buckets=num_buckets, max_distance=max_distance
    )
    assert torch.equal(ours, theirs)


def test_t5_buckets_follow_the_paper():
    """Half the buckets exact, then log-spaced, and everything from max_distance on in the last one."""
    buckets = hf_posenc.t5_buckets(torch.arange(0, 1000), num_buckets=32, max_distance=128)
    assert torch.equal(buckets[:16], torch.arange(16))
    assert bool((buckets[128:] == 31).all()) and bool((buckets[:128] < 31).any())
    assert bool((buckets.diff() >= 0).all())  # monotone
    assert hf_posenc.t5_buckets(torch.tensor([-3]), num_buckets=32, max_distance=128).item() == 0  # a future key


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_buckets": 32, "max_distance": 16}, "max_distance must be at least num_buckets"),
        ({"num_buckets": 1, "max_distance": 16}, "num_buckets must be at least 2"),
        ({"num_buckets": 0, "max_distance": 16}, "num_buckets must be a positive integer"),
        ({"num_buckets": 8.5, "max_distance": 16}, "num_buckets must be a positive integer"),
    ],
)
def test_bad_bucketing_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hf_posenc.t5_buckets(torch.arange(4), **kwargs)


def test_alibi_init_is_alibi_at_each_buckets_mean_distance():
    """``init="alibi"``: -m_h times the mean of the distances 0..max_distance in each bucket."""
    table = t5_bias_init(6, num_buckets=8, max_distance=20, init="alibi")
    distances = torch.arange(21)
    buckets = hf_posenc.t5_buckets(distances, num_buckets=8, max_distance=20)
    for bucket in range(8):
        mean = distances[buckets == bucket].double().mean()
        torch.testing.assert_close(table[bucket], -mean * alibi_slopes(6))
    assert torch.equal(bucket_distances(8, 20)[:4], torch.arange(4, dtype=torch.float64))  # the exact ones


def test_a_bucket_no_distance_falls_in_gets_the_start_of_its_range():
    """32 buckets up to 32: the log-spaced ones are narrower than 1 near 16, and bucket 20 holds no distance."""
    buckets = hf_posenc.t5_buckets(torch.arange(33), num_buckets=32, max_distance=32)
    assert 20 not in buckets.tolist()
    assert bucket_distances(32, 32)[20].item() == pytest.approx(16 * 2 ** (4 / 16))
    assert not t5_bias_init(6, num_buckets=8, max_distance=20, init="zeros").any()
