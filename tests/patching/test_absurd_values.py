"""Absurd method values, and a model whose RoPE base makes no sense, are refused in one line before the model
changes (accepted, they would overflow, divide by zero, or patch in inf / zero frequencies)."""

from __future__ import annotations

import pytest
from helpers import assert_refused, assert_same, snapshot
from tiny_models import make_tiny

import hf_posenc

PAIRS = 8  # tiny llama: head_dim 16
ABSURD = [
    ("factor overflowing ntk", "ntk", {"factor": 1e308}, r"factor must be at most 2\^24 = 16777216 .*got 1e\+308"),
    ("factor past the bound", "yarn", {"factor": 2.0**24 + 1}, r"factor must be at most 2\^24"),
    ("longrope context one", "longrope", {"factor": 4, "long_factor": [1.0] * PAIRS, "original_max_position_embeddings": 1}, "must be >= 2 for LongRoPE's default attention factor"),
    ("huge attention factor", "yarn", {"factor": 4, "attention_factor": 1e30}, r"attention_factor must be at most 1.845e\+19"),
    ("huge beta_fast", "yarn", {"factor": 4, "beta_fast": 1e308}, r"beta_fast=1e\+308 is out of range for the YaRN ramp"),
    ("llama4 log-n overflowing", "logn", {"variant": "llama4", "attn_scale": 1e5, "floor_scale": 1}, r"attn_scale must be at most 2363 with floor_scale=1 .*finite in float16 up to p = 2\*\*40\), got 100000.0"),
    ("llama4 log-n past the bound", "logn", {"variant": "llama4", "attn_scale": 3501}, r"attn_scale must be at most 3500 with floor_scale=8192"),
    ("long factor underflowing", "longrope", {"factor": 4, "long_factor": [1e300] * PAIRS}, r"method 'longrope' with base=10000.0, .* gives inverse frequencies from .* RoPE needs each finite and > 0 in float32"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "method", "params", "match"), ABSURD, ids=[case[0] for case in ABSURD])
def test_absurd_values_are_refused_and_change_nothing(case, method, params, match):
    assert_refused(make_tiny("llama"), method, params, ValueError, match)


@pytest.mark.parametrize("theta", [0.0, -10000.0, 1.0])
def test_a_config_whose_rope_base_is_not_above_one_is_refused(theta):
    model = make_tiny("llama")
    model.config.rope_parameters = {**model.config.rope_parameters, "rope_theta": theta}  # TINY's dict is shared
    before = snapshot(model)
    with pytest.raises(ValueError, match=rf"base \(the RoPE base b, rope_theta\) must be > 1 .*got {theta}"):
        hf_posenc.patch(model, "yarn", factor=2)
    assert_same(before, snapshot(model))
