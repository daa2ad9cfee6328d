"""The pure math against formulas written from the papers, and against transformers where native."""

from __future__ import annotations

import math
import re

import paper_formulas as paper
import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import hf_posenc
from hf_posenc.methods._common import frequency_problem
from hf_posenc.methods.yarn import correction_dim
from hf_posenc.registry import Method, get_method, register

D, B, L = 64, 100000.0, 8192  # SmolLM2-135M
LONG = [1.0 + i / 16 for i in range(D // 2)]
SHORT = [1.0 + i / 64 for i in range(D // 2)]

# (method, params, seq_len, reference) for every registered method; test_every_method_is_covered
# fails when a method is added without a case here.
CASES = [
    ("pi", {"factor": 4}, None, lambda: paper.pi(D, B, L, 4)),
    ("pi", {"factor": 2.5}, None, lambda: paper.pi(D, B, L, 2.5)),
    ("ntk", {"factor": 4}, None, lambda: paper.ntk(D, B, L, 4)),
    ("dynamic-ntk", {"factor": 4}, 4000, lambda: paper.dynamic_ntk(D, B, L, 4, 4000)),
    ("dynamic-ntk", {"factor": 4}, 20000, lambda: paper.dynamic_ntk(D, B, L, 4, 20000)),
    ("ntk-by-parts", {"factor": 4}, None, lambda: (paper.by_parts(D, B, L, 4), 1.0)),
    ("yarn", {"factor": 4}, None, lambda: paper.yarn(D, B, L, 4)),
    ("yarn", {"factor": 16, "ramp": "ratio"}, None, lambda: paper.yarn(D, B, L, 16, ramp="ratio")),
    ("yarn", {"factor": 8, "beta_fast": 16, "beta_slow": 2}, None, lambda: paper.yarn(D, B, L, 8, beta_fast=16, beta_slow=2)),
    ("yarn", {"factor": 4, "truncate": False}, None, lambda: paper.yarn(D, B, L, 4, truncate=False)),
    ("dynamic-yarn", {}, 6000, lambda: paper.dynamic_yarn(D, B, L, 6000)),
    ("dynamic-yarn", {}, 30000, lambda: paper.dynamic_yarn(D, B, L, 30000)),
    ("llama3", {"factor": 8}, None, lambda: paper.llama3(D, B, L, 8)),
    ("llama3", {"factor": 4, "low_freq_factor": 2, "high_freq_factor": 8}, None, lambda: paper.llama3(D, B, L, 4, 2, 8)),
    ("longrope", {"factor": 4, "long_factor": LONG, "short_factor": SHORT}, 9000, lambda: paper.longrope(D, B, L, 4, LONG, SHORT, 9000)),
    ("longrope", {"factor": 4, "long_factor": LONG, "short_factor": SHORT}, 100, lambda: paper.longrope(D, B, L, 4, LONG, SHORT, 100)),
]  # fmt: skip


@pytest.mark.parametrize(("method", "params", "seq_len", "reference"), CASES)
def test_frequencies_match_the_papers(method, params, seq_len, reference):
    inv_freq, factor = hf_posenc.rope_frequencies(
        method, head_dim=D, base=B, original_max_position_embeddings=L, seq_len=seq_len, **params
    )
    expected, expected_factor = reference()
    assert inv_freq.dtype == torch.float64
    torch.testing.assert_close(inv_freq, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0)
    assert factor == pytest.approx(expected_factor, rel=1e-12)


def test_every_method_is_covered():
    """Every method with RoPE frequencies; ALiBi (no frequencies) is covered in test_alibi.py, the attention-level
    methods (Self-Extend, DCA, STRING, ReRoPE, Leaky ReRoPE, log-n) against a paper reference in
    test_extension_reference.py, NoPE, sinusoidal and
    the T5 bias in test_encodings.py and test_t5_bias.py."""
    rope_scaling = {name for name in hf_posenc.available_methods() if get_method(name).frequencies is not None}
    assert {case[0] for case in CASES} == rope_scaling
    assert set(hf_posenc.available_methods()) - rope_scaling == {
        "alibi",
        "dca",
        "leaky-rerope",
        "logn",
        "nope",
        "rerope",
        "self-extend",
        "sinusoidal",
        "string",
        "t5-bias",
    }


def test_llama2_correction_range_is_pairs_20_to_46():
    """Background: for LLaMA-2 (b=1e4, d=128, L=4096) the ramp runs over pairs 20 ... 46."""
    assert math.floor(correction_dim(32, 128, 1e4, 4096)) == 20
    assert math.ceil(correction_dim(1, 128, 1e4, 4096)) == 46
    inv_freq, _ = hf_posenc.rope_frequencies(
        "ntk-by-parts", head_dim=128, base=1e4, original_max_position_embeddings=4096, factor=8
    )
    theta = torch.tensor(paper.theta(128, 1e4), dtype=torch.float64)
    assert torch.equal(inv_freq[:21], theta[:21])  # kept: high frequencies
    torch.testing.assert_close(inv_freq[46:], theta[46:] / 8, rtol=1e-15, atol=0)  # interpolated like PI
    assert ((inv_freq[21:46] < theta[21:46]) & (inv_freq[21:46] > theta[21:46] / 8)).all()


def test_ramp_direction_keeps_high_frequencies():
    """The paper, not the text that states it backwards: pairs with many rotations (r > beta) are kept."""
    for ramp in ("index", "ratio"):
        inv_freq, _ = hf_posenc.rope_frequencies(
            "yarn", head_dim=D, base=B, original_max_position_embeddings=L, factor=4, ramp=ramp
        )
        theta = torch.tensor(paper.theta(D, B), dtype=torch.float64)
        ratio = L * theta / (2 * math.pi)
        assert torch.equal(inv_freq[ratio > 32], theta[ratio > 32])
        torch.testing.assert_close(inv_freq[ratio < 1], theta[ratio < 1] / 4, rtol=1e-15, atol=0)


@pytest.mark.parametrize("method", ["yarn", "ntk-by-parts", "dynamic-yarn"])
@pytest.mark.parametrize(
    ("params", "kept"),
    [  # (the ramp's parameters, whether §3.2 keeps every pair: True, or interpolates every pair: False)
        ({"head_dim": 128, "base": 1e4, "original_max_position_embeddings": 4096, "beta_fast": 2048, "beta_slow": 1400}, False),
        ({"head_dim": 128, "base": 1e4, "original_max_position_embeddings": 4096, "beta_fast": 1024, "beta_slow": 700}, False),
        ({"head_dim": 64, "base": 1e4, "original_max_position_embeddings": 4}, False),  # L < 2 pi: below one turn
        ({"head_dim": 64, "base": 10.0, "original_max_position_embeddings": 131072}, True),  # every pair > 32 turns
    ],
)  # fmt: skip
def test_an_index_band_outside_the_pairs_is_refused_where_the_clamped_ramp_runs_backwards(method, params, kept):
    """The released index ramp clamps its band to the pairs; wholly outside them the clamp turns it around (keeps
    every pair where §3.2 interpolates all, or the reverse), and transformers' yarn computes the same. Refused with
    the paper's ramp named, not run with the inverted frequencies silently; ``ramp="ratio"`` gives the paper's
    values."""
    scale = {"seq_len": 8 * params["original_max_position_embeddings"]} if method == "dynamic-yarn" else {"factor": 8}
    with pytest.raises(ValueError, match=r"ramp='index' .* runs backwards here: .* Use ramp='ratio'"):
        hf_posenc.rope_frequencies(method, **scale, **params)
    inv_freq, _ = hf_posenc.rope_frequencies(method, ramp="ratio", **scale, **params)
    theta = torch.tensor(paper.theta(params["head_dim"], params["base"]), dtype=torch.float64)
    torch.testing.assert_close(inv_freq, theta if kept else theta / 8, rtol=1e-15, atol=0)


def test_yarn_attention_factor_is_the_papers():
    for s, expected in [(2, 1.0693147), (4, 1.1386294), (16, 1.2772589), (32, 1.3465736)]:
        _, factor = hf_posenc.rope_frequencies("yarn", head_dim=D, base=B, original_max_position_embeddings=L, factor=s)
        assert factor == pytest.approx(expected, abs=1e-7)


def test_yarn_mscale_ratio():
    """The authors' code's variant: (0.1 mscale ln s + 1) / (0.1 mscale_all_dim ln s + 1)."""
    s = 4
    expected = (0.1 * 1.0 * math.log(s) + 1) / (0.1 * 0.5 * math.log(s) + 1)
    _, factor = hf_posenc.rope_frequencies(
        "yarn", head_dim=D, base=B, original_max_position_embeddings=L, factor=s, mscale=1.0, mscale_all_dim=0.5
    )
    assert factor == pytest.approx(expected, rel=1e-15)
    _, agreeing = hf_posenc.rope_frequencies(
        "yarn", head_dim=D, base=B, original_max_position_embeddings=L, factor=s,
        mscale=1.0, mscale_all_dim=0.5, attention_factor=expected,
    )  # fmt: skip
    assert agreeing == factor


def test_dynamic_methods_are_the_unscaled_rope_inside_the_context():
    theta = torch.tensor(paper.theta(D, B), dtype=torch.float64)
    for method, params in [("dynamic-ntk", {"factor": 4}), ("dynamic-yarn", {})]:
        for seq_len in (None, 1, L):
            inv_freq, factor = hf_posenc.rope_frequencies(
                method, head_dim=D, base=B, original_max_position_embeddings=L, seq_len=seq_len, **params
            )
            torch.testing.assert_close(inv_freq, theta, rtol=1e-15, atol=0)
            assert factor == 1.0


def _transformers(rope_parameters: dict, seq_len=None) -> tuple[torch.Tensor, float]:
    config = LlamaConfig(
        hidden_size=D * 4, num_attention_heads=4, max_position_embeddings=L, rope_parameters=dict(rope_parameters)
    )
    return ROPE_INIT_FUNCTIONS[config.rope_parameters["rope_type"]](config, None, seq_len=seq_len)


NATIVE = [
    ("pi", {"factor": 4}, {"rope_type": "linear", "factor": 4.0}, None),
    ("dynamic-ntk", {"factor": 4}, {"rope_type": "dynamic", "factor": 4.0}, 20000),
    ("yarn", {"factor": 4}, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L}, None),
    ("yarn", {"factor": 4, "mscale": 1.0, "mscale_all_dim": 0.5}, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L, "mscale": 1.0, "mscale_all_dim": 0.5}, None),
    ("ntk-by-parts", {"factor": 4}, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L, "attention_factor": 1.0}, None),
    ("llama3", {"factor": 8}, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": L}, None),
    ("longrope", {"factor": 4, "long_factor": LONG}, {"rope_type": "longrope", "factor": 4.0, "long_factor": LONG, "short_factor": [1.0] * (D // 2), "original_max_position_embeddings": L}, 9000),
]  # fmt: skip


@pytest.mark.parametrize(("method", "params", "rope_parameters", "seq_len"), NATIVE)
def test_native_methods_equal_transformers(method, params, rope_parameters, seq_len):
    inv_freq, factor = hf_posenc.rope_frequencies(
        method, head_dim=D, base=B, original_max_position_embeddings=L, seq_len=seq_len, **params
    )
    theirs, their_factor = _transformers({"rope_theta": B, **rope_parameters}, seq_len)
    torch.testing.assert_close(inv_freq, theirs.double(), rtol=1e-6, atol=0)
    assert factor == pytest.approx(their_factor, rel=1e-6)


def test_ratio_ramp_differs_from_transformers_yarn():
    """The paper's gamma(r) is linear in r; the released code's ramp is linear in log r. Not the same."""
    ours, _ = hf_posenc.rope_frequencies(
        "yarn", head_dim=D, base=B, original_max_position_embeddings=L, factor=4, ramp="ratio"
    )
    theirs, _ = _transformers(
        {"rope_theta": B, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L}
    )
    assert (ours - theirs.double()).abs().max() / theirs.max() > 1e-3


@pytest.mark.parametrize(
    ("method", "params", "error", "match"),
    [
        ("no-such", {"factor": 2}, ValueError, "Available methods: alibi, dca, dynamic-ntk, dynamic-yarn"),
        ("yarn", {"factor": 0}, ValueError, "factor must be >= 1"),
        ("yarn", {"factor": -2}, ValueError, "factor must be >= 1"),
        ("pi", {"factor": 0.5}, ValueError, "got 0.5"),
        ("pi", {"factor": float("nan")}, ValueError, "finite"),
        ("pi", {"factor": "4"}, TypeError, "must be a number"),
        ("pi", {"factor": True}, TypeError, "must be a number"),
        ("pi", {}, TypeError, r"^Method 'pi': 'factor' must be given \(pi:factor=\.\.\. in a method spec, factor=\.\.\. in patch\)\. Valid"),
        ("yarn", {"factor": 4, "beta_fast": 1, "beta_slow": 32}, ValueError, "beta_fast must be greater"),
        ("yarn", {"factor": 4, "beta_fast": 2, "beta_slow": 2}, ValueError, "beta_fast must be greater"),
        ("yarn", {"factor": 4, "ramp": "cosine"}, ValueError, "ramp must be one of"),
        ("yarn", {"factor": 4, "mscale": 1.0}, ValueError, "mscale and mscale_all_dim go together"),
        ("yarn", {"factor": 4, "mscale": 1.0, "mscale_all_dim": 0}, ValueError, "mscale_all_dim must be > 0"),
        ("yarn", {"factor": 4, "mscale": 1.0, "mscale_all_dim": 0.5, "attention_factor": 1.2}, ValueError, "disagrees with mscale"),
        ("yarn", {"factor": 4, "fctor": 4}, TypeError, "Unknown parameter.*'fctor'.*Valid parameters: original"),
        ("llama3", {"factor": 8, "low_freq_factor": 4, "high_freq_factor": 1}, ValueError, "high_freq_factor must be greater"),
        ("longrope", {"factor": 4, "long_factor": [1.0] * 3}, ValueError, "long_factor has 3 values.*needs 32"),
        ("longrope", {"factor": 4, "long_factor": [0.0] * 32}, ValueError, r"long_factor\[0\] must be > 0"),
        ("longrope", {"factor": 4, "long_factor": "2"}, TypeError, "list of numbers"),
        ("longrope", {"factor": 4, "long_factor": dict.fromkeys(range(32), 1.0)}, TypeError, "list of numbers"),
        ("longrope", {"factor": 4, "long_factor": {1.0, 2.0}}, TypeError, "list of numbers"),
        # absurd values: a one-line error where the arithmetic would overflow, divide by zero or give inf / 0
        ("ntk", {"factor": 1e308}, ValueError, r"factor must be at most 2\^24 = 16777216 .*got 1e\+308"),
        ("dynamic-ntk", {"factor": 2.0**24 + 1}, ValueError, r"factor must be at most 2\^24"),
        ("yarn", {"factor": 4, "original_max_position_embeddings": 10**400}, ValueError, "original_max_position_embeddings must be at most 9007199254740992"),
        ("yarn", {"factor": 4, "beta_fast": 1e308}, ValueError, r"beta_fast=1e\+308 is out of range for the YaRN ramp.*between 7.25e-306 and 2.86e\+307"),
        ("yarn", {"factor": 4, "beta_fast": 32, "beta_slow": 1e-310}, ValueError, r"beta_slow=1e-310 is out of range"),
        ("yarn", {"factor": 4, "attention_factor": 1e20}, ValueError, r"attention_factor must be at most 1.845e\+19 \(it multiplies q.k by its square"),
        ("yarn", {"factor": 4, "mscale": 1e300, "mscale_all_dim": 1}, ValueError, r"the attention factor of mscale=1e\+300 and mscale_all_dim=1.0 must be at most"),
        ("yarn", {"factor": 2**24, "mscale": 1.7e308, "mscale_all_dim": 1.7e308}, ValueError, "the attention factor of mscale=.* must be finite, got nan"),
        ("longrope", {"factor": 4, "long_factor": [1.0] * 32, "original_max_position_embeddings": 1}, ValueError, r"original_max_position_embeddings must be >= 2 for LongRoPE's default attention factor .*got 1; give attention_factor"),
        ("longrope", {"factor": 4, "long_factor": [1e-308] * 32}, ValueError, r"method 'longrope' with base=100000.0, .*long_factor=\[1e-308..1e-308\] \(32 values\).* gives inverse frequencies from 1.433e\+303 to 1e\+308; RoPE needs each finite and > 0 in float32"),
        ("longrope", {"factor": 4, "long_factor": [1.0] * 32, "attention_factor": float("inf")}, ValueError, "attention_factor must be finite, got inf"),
    ],
)  # fmt: skip
def test_bad_parameters_raise_clearly(method, params, error, match):
    params = dict(params)
    context = params.pop("original_max_position_embeddings", L)
    with pytest.raises(error, match=match):
        hf_posenc.rope_frequencies(
            method, head_dim=D, base=B, original_max_position_embeddings=context, seq_len=9000, **params
        )


@pytest.mark.parametrize("base", [0, -1.0, 1, 0.5, float("nan"), float("inf")])
def test_a_base_that_is_not_above_one_is_refused_by_name(base):
    """``b <= 1`` would give NaN or inf frequencies (``0 ** -x``, ``(-1) ** -x``) or divide by ``ln 1``."""
    for method, params in [("pi", {"factor": 2}), ("yarn", {"factor": 2}), ("ntk", {"factor": 2})]:
        with pytest.raises(ValueError, match=r"^base (\(the RoPE base b, rope_theta\) must be > 1|must be finite)"):
            hf_posenc.rope_frequencies(method, head_dim=D, base=base, original_max_position_embeddings=L, **params)


def test_frequencies_that_float32_cannot_hold_are_refused():
    """A base so large that theta_i underflows to 0 in float32 (no rotation) is named with its values."""
    with pytest.raises(ValueError, match=r"method 'pi' with base=1e\+300, .*factor=2.0 gives inverse frequencies from"):
        hf_posenc.rope_frequencies("pi", head_dim=D, base=1e300, original_max_position_embeddings=L, factor=2)
    with pytest.raises(ValueError, match=r"The NTK-aware base b \* s\^\(d/\(d-2\)\) overflows for base=100000.0"):
        hf_posenc.rope_frequencies(
            "dynamic-ntk", head_dim=D, base=B, original_max_position_embeddings=L, factor=4, seq_len=10**300
        )


def test_every_methods_result_is_checked_for_float32():
    """What each method returns passes one check (here on hand-made results): the frequencies and the attention factor."""
    assert frequency_problem(torch.tensor([1.0, 1e-3], dtype=torch.float64), 1.2) is None
    assert "from 1e-50 to 1" in frequency_problem(torch.tensor([1.0, 1e-50], dtype=torch.float64), 1.0)
    for factor in (float("nan"), 0.0, 1e20):
        assert frequency_problem(torch.ones(2), factor).startswith(
            f"gives the attention factor {factor!r}; it must be > 0"
        )


def test_the_largest_factor_still_gives_usable_frequencies():
    """The bound is inclusive, and at it every method's frequencies are finite and > 0 in float32."""
    for method in ("pi", "ntk", "dynamic-ntk", "ntk-by-parts", "yarn", "llama3"):
        inv_freq, factor = hf_posenc.rope_frequencies(
            method, head_dim=D, base=B, original_max_position_embeddings=L, factor=2.0**24, seq_len=2 * L
        )
        assert (inv_freq.float() > 0).all() and inv_freq.float().isfinite().all() and math.isfinite(factor)


def test_registry_refuses_duplicates_and_resolves_aliases():
    with pytest.raises(ValueError, match="already registered"):
        register(get_method("yarn"))
    with pytest.raises(ValueError, match="already registered"):
        register(Method(name="linear", params=object, frequencies=print, transformers_rope=print))
    assert get_method("linear").name == "pi"
    assert get_method("Dynamic_NTK").name == "dynamic-ntk"


@pytest.mark.parametrize("seq_len", [float("nan"), 100.0, "100", 0, -5, True])
@pytest.mark.parametrize("method", ["dynamic-ntk", "dynamic-yarn", "longrope", "yarn"])
def test_a_seq_len_that_is_no_length_is_refused_by_name(method, seq_len):
    params = {"longrope": {"factor": 4, "long_factor": [1.0] * (D // 2)}, "dynamic-yarn": {}}.get(method, {"factor": 4})
    with pytest.raises(
        ValueError,
        match=f"seq_len \\(the current length l\\) must be a positive integer or None, got {re.escape(repr(seq_len))}",
    ):
        hf_posenc.rope_frequencies(
            method, head_dim=D, base=B, original_max_position_embeddings=L, seq_len=seq_len, **params
        )
