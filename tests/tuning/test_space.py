"""The candidates of a tune: each reaches the target by its method's own formula, with the parameters its authors
derive from L and T; a family that cannot reach it is left out, and bad input is refused before anything runs."""

from __future__ import annotations

import math

import pytest

from hf_posenc.registry import get_method
from hf_posenc.tuning.space import FAMILIES, search_space


def _reach(text: str, trained: int) -> float:
    """The longest input a candidate serves, from each paper's formula (inf: any length)."""
    name, _, rest = text.partition(":")
    params = dict(part.split("=") for part in rest.split(",")) if rest else {}
    base = name.removesuffix("+logn")
    if "factor" in params and base in ("yarn", "ntk", "dynamic-ntk"):
        return float(params["factor"]) * trained  # s = L'/L
    if base == "self-extend":
        group, window = int(params["group_size"]), int(params["window"])
        return (trained - window) * group + window  # Jin et al. 2024, §3
    if base == "string":
        return trained + int(params["shifted_offset"]) - 128  # An et al. 2025: L + S - W
    if base == "leaky-rerope":
        return int(params["max_position_embeddings"])  # k derived so that T's farthest pair sits at L - 1
    return math.inf  # dynamic YaRN, DCA, ReRoPE: any length


@pytest.mark.parametrize(
    ("trained", "target"), [(8192, 16384), (8192, 32768), (8192, 10000), (4096, 131072), (64, 128)]
)
def test_every_candidate_reaches_the_target(trained, target):
    candidates = search_space(trained, target)
    assert candidates and all(_reach(c.text, trained) >= target for c in candidates)
    assert len({c.text for c in candidates}) == len(candidates)
    for candidate in candidates:  # its own checks pass on the model's L
        get_method(candidate.spec.method).make_params(**candidate.spec.params, original_max_position_embeddings=trained)


def test_the_settings_follow_the_authors_rules():
    texts = [c.text for c in search_space(8192, 32768, logn=False)]
    assert texts[:2] == ["yarn:factor=4.0", "yarn:factor=8.0"]  # T/L and the next step
    # Self-Extend: W = L/4, the smallest power-of-two G with (L - W) G + W >= T: (6144 * 8 + 2048 = 51200)
    assert "self-extend:group_size=8,window=2048" in texts and "self-extend:group_size=4,window=2048" not in texts
    assert "leaky-rerope:max_position_embeddings=32768" in texts
    assert not [t for t in texts if t.startswith("string")]  # L + S - W < 2L: STRING cannot reach 4L
    near = [c.text for c in search_space(8192, 10000, ["string"], logn=False)]
    assert near == ["string:shifted_offset=2703"]  # int(0.33 L), the authors' default, reaches 10000


def test_log_n_joins_each_candidate_that_combines_with_it():
    texts = [c.text for c in search_space(64, 128, ["yarn", "dynamic-yarn", "dca"])]
    assert texts == [
        "yarn:factor=2.0", "yarn+logn:factor=2.0", "yarn:factor=4.0", "yarn+logn:factor=4.0",
        "dynamic-yarn", "dynamic-yarn+logn", "dca", "dca+logn", "dca:chunk_size=32", "dca+logn:chunk_size=32",
    ]  # fmt: skip


def test_families_are_narrowed_by_name_or_alias_and_bad_ones_refused():
    assert {c.family for c in search_space(64, 128, ["selfextend"], logn=False)} == {"self-extend"}
    with pytest.raises(ValueError, match="'alibi' is no training-free family a tune searches"):
        search_space(64, 128, ["alibi"])
    with pytest.raises(ValueError, match="Unknown"):
        search_space(64, 128, ["no-such-method"])
    with pytest.raises(ValueError, match="The target length 64 is inside the trained context 64"):
        search_space(64, 64)
    assert set(FAMILIES) >= {"yarn", "dynamic-yarn", "self-extend", "dca", "string", "ntk", "dynamic-ntk", "rerope"}
