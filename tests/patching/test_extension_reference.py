"""Self-Extend, DCA, STRING, ReRoPE, Leaky ReRoPE and log-n (alone and combined) against an independent float64 forward pass
(tests/extension_reference.py, written from the papers), on the tiny models of every RoPE family (L = 64).

Inputs of 96 to 126 tokens reach every segment: Self-Extend's neighbour and grouped pairs (up to its reach), DCA's
same-chunk, previous-chunk and earlier-chunk pairs (both branches of its min()), log-n past L. Also: the reference
without a method is transformers' own forward, the methods change nothing where their definition is the identity,
the remapped distances stay within the trained context, and the tolerance is far below an off-by-one position.
"""

from __future__ import annotations

import functools

import extension_reference as ref
import pytest
import torch
from tiny_models import make_tiny

import hf_posenc
from hf_posenc.attention import extension_tiles
from hf_posenc.methods.remap import remap_distance
from hf_posenc.registry import get_method

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

L = 64
FAMILIES = ["llama", "mistral", "qwen2", "qwen3"]
# transformers computes RMSNorm, the rotary cos/sin and the eager softmax in float32 even in a float64 model, so
# the unpatched float64 model itself sits ~1e-7 from the float64 reference (logits ~0.6); a position off by one in
# any segment moves the logits by >= 4e-4 (test_the_tolerance_resolves_an_off_by_one_position).
TOLERANCE = {"rtol": 0.0, "atol": 5e-7}

# name: (method, params, length). Self-Extend reaches (64 - W) * G + W tokens: 208 for G=4, W=16; 126 for G=3, W=33.
# DCA 48/4: chunks of s = 44, the previous-chunk query at min(i mod 44 + 44, 48) (clamped from i mod 44 = 5), the
# earlier chunks' at min(87, 48) = 48. DCA 20/15: s = 5, the previous-chunk query never clamped (at most 9), the
# earlier chunks' at 2s - 1 = 9 < 20: the other branch of both min().
CASES = {
    "self-extend-g4-w16": ("self-extend", {"group_size": 4, "window": 16}, 112),
    "self-extend-g3-w33-reach": ("self-extend", {"group_size": 3, "window": 33}, 126),
    "dca-48-4": ("dca", {"chunk_size": 48, "local_size": 4}, 120),
    "dca-20-15": ("dca", {"chunk_size": 20, "local_size": 15}, 100),
    "logn-qwen": ("logn", {}, 100),
    "logn-llama4": ("logn", {"variant": "llama4", "attn_scale": 0.5, "floor_scale": 10}, 100),
    "self-extend+logn": ("self-extend+logn", {"group_size": 4, "window": 16}, 100),
    "self-extend+logn-llama4": (
        "self-extend+logn",
        {"group_size": 2, "window": 8, "variant": "llama4", "attn_scale": 0.5, "floor_scale": 10},
        96,
    ),
    "dca+logn": ("dca+logn", {"chunk_size": 48, "local_size": 4}, 120),
    "yarn+dca+logn": ("yarn+dca+logn", {"factor": 2, "chunk_size": 48, "local_size": 4}, 120),
    "yarn+logn": ("yarn+logn", {"factor": 2}, 100),
    "yarn+logn-betas": ("yarn+logn", {"factor": 4, "beta_fast": 16, "beta_slow": 2}, 96),
    # STRING S=32, W=8 reaches L + S - W = 88 tokens; S=21 at 60 tokens changes attention inside L (with the
    # authors' attention factor, the default); with log-n past L.
    "string-s32-w8-reach": ("string", {"shifted_offset": 32, "local_value": 8, "attention_factor": 1.0}, 88),
    "string-inside-L": ("string", {"shifted_offset": 21, "local_value": 4}, 60),
    "string+logn": ("string+logn", {"shifted_offset": 24, "local_value": 8}, 80),
    # ReRoPE w=16 caps every distance at 16; with log-n it is the authors' rerope_patch.py; over YaRN's frequencies.
    "rerope-w16": ("rerope", {"window": 16}, 100),
    "rerope+logn": ("rerope+logn", {"window": 16}, 100),
    "yarn+rerope": ("yarn+rerope", {"factor": 2, "window": 16}, 100),
    # Leaky ReRoPE: fractional positions w + (d - w) / k past the window.
    "leaky-rerope-w16-k4": ("leaky-rerope", {"window": 16, "k": 4.0}, 120),
    "leaky-rerope+logn": ("leaky-rerope+logn", {"window": 8, "k": 2.5}, 100),
}
REMAP_CASES = [name for name, (method, _, _) in CASES.items() if set(method.split("+")) & set(ref.REMAPS)]
OTHER_CASES = [name for name in CASES if name not in REMAP_CASES]
# flex runs uncompiled on CPU: few cases
FLEX_CASES = ["self-extend-g4-w16", "dca-48-4", "self-extend+logn", "string-inside-L", "leaky-rerope+logn"]


def tokens(length: int, seed: int = 0, batch: int = 1) -> torch.Tensor:
    return torch.randint(1, 97, (batch, length), generator=torch.Generator().manual_seed(seed))


@functools.cache
def expected(family: str, case: str) -> torch.Tensor:
    method, params, length = CASES[case]
    return ref.reference_logits(make_tiny(family), tokens(length), method, original_max_position_embeddings=L, **params)


def patched_logits(family: str, case: str, dtype=torch.float64, implementation="eager", **extra) -> torch.Tensor:
    method, params, length = CASES[case]
    model = make_tiny(family, attn_implementation=implementation).to(dtype)
    hf_posenc.patch(model, method, original_max_position_embeddings=L, **params, **extra)
    with torch.no_grad():  # flex on CPU runs only without autograd
        return model(tokens(length)).logits


@pytest.mark.parametrize("family", FAMILIES)
def test_reference_without_a_method_is_the_transformers_forward(family):
    """The reference forward itself (embeddings, RMSNorm, GQA, RoPE, SwiGLU; Qwen2's biases, Qwen3's q/k norms)
    equals the unpatched model on a batch of two 130-token rows, past L: what the method tests build on."""
    model = make_tiny(family).double()
    ids = tokens(130, batch=2)
    with torch.no_grad():
        actual = model(ids).logits
    torch.testing.assert_close(actual, ref.reference_logits(model, ids), **TOLERANCE)


@pytest.mark.parametrize("backend", ["eager", "blocked", "sdpa", "sdpa-blocks"])
@pytest.mark.parametrize("case", REMAP_CASES)
@pytest.mark.parametrize("family", FAMILIES)
def test_remaps_equal_the_reference(monkeypatch, family, case, backend):
    """The remaps, alone and with log-n (and YaRN): every segment's logits, merged under one softmax, are
    the papers' positions rotated directly; on the CPU backends, in float64. ``sdpa`` runs this prefill as tiles;
    ``sdpa-blocks`` is the same backend with the tiles off, as it runs with a cache or a gradient."""
    if backend == "sdpa-blocks":
        monkeypatch.setattr(extension_tiles, "tile_starts", lambda *args: None)
        backend = "sdpa"
    actual = patched_logits(family, case, backend=backend)
    torch.testing.assert_close(actual, expected(family, case), **TOLERANCE)


@pytest.mark.parametrize("case", FLEX_CASES)
@pytest.mark.parametrize("family", FAMILIES)
def test_flex_backend_equals_the_reference(family, case):
    """The flex_attention backend (uncompiled on CPU, under no_grad) computes the same merged softmax."""
    actual = patched_logits(family, case, backend="flex")
    torch.testing.assert_close(actual, expected(family, case), **TOLERANCE)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("case", OTHER_CASES)
@pytest.mark.parametrize("family", FAMILIES)
def test_logn_and_yarn_logn_equal_the_reference(family, case, implementation):
    """log-n (Qwen's and Llama 4's) and YaRN with log-n scale each query by its position's factor, on the model's
    eager and sdpa attention."""
    actual = patched_logits(family, case, implementation=implementation)
    torch.testing.assert_close(actual, expected(family, case), **TOLERANCE)


def _first_rows_unchanged(family, method, params, rows, before, *, exact, backend=None, implementation="eager"):
    """The first ``rows`` logits of a 100-token forward (float32, the default) patched with ``method`` equal
    ``before`` (bit for bit if ``exact``); the later rows differ (else the check would be empty)."""
    model = make_tiny(family, attn_implementation=implementation)
    extra = {} if backend is None else {"backend": backend}
    hf_posenc.patch(model, method, original_max_position_embeddings=L, **params, **extra)
    with torch.no_grad():
        after = model(tokens(100)).logits
    if exact:
        assert torch.equal(after[:, :rows], before[:, :rows])
    else:
        torch.testing.assert_close(after[:, :rows], before[:, :rows], rtol=0, atol=1e-6)
    assert (after[:, rows:] - before[:, rows:]).abs().max() > 1e-4


def _logits(family, method=None, implementation="eager", **params):
    model = make_tiny(family, attn_implementation=implementation)
    if method is not None:
        hf_posenc.patch(model, method, original_max_position_embeddings=L, **params)
    with torch.no_grad():
        return model(tokens(100)).logits


@pytest.mark.parametrize("family", FAMILIES)
def test_remaps_are_the_model_inside_the_window_and_the_first_chunk(family):
    """Self-Extend's first W queries see only neighbours, DCA's first s only their own chunk, STRING's first S and
    ReRoPE's first w only their band: true positions (STRING without its attention factor), so
    the unpatched model's logits up to float32 rounding (the math is the same, the computation is not)."""
    base = _logits(family)
    for backend in ("eager", "blocked", "sdpa"):
        se = {"group_size": 4, "window": 16}
        _first_rows_unchanged(family, "self-extend", se, 16, base, exact=False, backend=backend)
        dca = {"chunk_size": 48, "local_size": 4}
        _first_rows_unchanged(family, "dca", dca, 44, base, exact=False, backend=backend)
        string = {"shifted_offset": 21, "local_value": 4, "attention_factor": 1.0}
        _first_rows_unchanged(family, "string", string, 21, base, exact=False, backend=backend)
        for method in ("rerope", "leaky-rerope"):
            _first_rows_unchanged(family, method, {"window": 16}, 16, base, exact=False, backend=backend)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("family", FAMILIES)
def test_logn_is_the_model_bit_for_bit_where_its_factor_is_one(family, implementation):
    """Qwen's factor is exactly 1.0 for the first L positions (ln(p + 1) / ln L <= 1), Llama 4's for the first
    floor_scale - 1; multiplying by 1.0 is exact, so those logits are the unpatched model's bit for bit, alone and
    on top of YaRN or Self-Extend."""
    base = _logits(family, implementation=implementation)
    _first_rows_unchanged(family, "logn", {}, L, base, exact=True, implementation=implementation)
    llama4 = {"variant": "llama4", "attn_scale": 0.5, "floor_scale": 10}
    _first_rows_unchanged(family, "logn", llama4, 9, base, exact=True, implementation=implementation)
    yarn = _logits(family, "yarn", implementation, factor=2)
    _first_rows_unchanged(family, "yarn+logn", {"factor": 2}, L, yarn, exact=True, implementation=implementation)
    if implementation == "eager":  # the remaps bring their own attention backend
        se = {"group_size": 4, "window": 16, "backend": "blocked"}
        self_extend = _logits(family, "self-extend", **se)
        _first_rows_unchanged(family, "self-extend+logn", se, L, self_extend, exact=True)


@pytest.mark.parametrize(
    ("method", "params", "length"),
    [
        ("self-extend", {"group_size": 4, "window": 16}, 208),
        ("self-extend", {"group_size": 3, "window": 12}, 168),
        ("self-extend", {"group_size": 8, "window": 32}, 288),
        ("self-extend", {"group_size": 1, "window": 8}, 64),
        ("dca", {"chunk_size": 48, "local_size": 4}, 1000),
        ("dca", {"chunk_size": 20, "local_size": 15}, 1000),
        ("dca", {"chunk_size": 64, "local_size": 16}, 1000),
    ],
)
def test_remap_distances_stay_within_the_trained_context(method, params, length):
    """The relative distance every pair's logit sees (hf_posenc's remap_distance, equal to the reference's
    positions): Self-Extend's never exceed L - 1 up to its reach (L - W) G + W (exactly L - 1 there, L one token
    later), DCA's never exceed chunk_size at any length; none is negative, and the neighbours' (Self-Extend:
    i - j < W; DCA: the same chunk) are the true distances."""
    library = get_method(method).make_params(original_max_position_embeddings=L, **params)
    position = torch.arange(length + 1)
    distance = remap_distance(library, position[:, None], position[None, :])  # one token past `length`
    query, key = ref.pair_positions(method, length + 1, **params)
    causal = torch.ones(length + 1, length + 1, dtype=torch.bool).tril()
    assert torch.equal(distance[causal], (query - key)[causal].long())
    assert distance[causal].min() == 0
    true = position[:, None] - position[None, :]
    if method == "self-extend":
        g, w = params["group_size"], params["window"]
        assert length == (L - w) * g + w
        assert distance[:length, :length].max() == L - 1 and distance[length].max() == L
        neighbour = causal & (true < w)
    else:
        s = params["chunk_size"] - params["local_size"]
        assert distance.max() <= params["chunk_size"]
        neighbour = causal & (position[:, None] // s == position[None, :] // s)
    assert torch.equal(distance[neighbour], true[neighbour])


@pytest.mark.parametrize(
    ("method", "params", "length"),
    [
        ("string", {"shifted_offset": 32, "local_value": 8}, 88),
        ("string", {"shifted_offset": 40, "local_value": 1}, 103),
        ("rerope", {"window": 16}, 1000),
        ("leaky-rerope", {"window": 16, "k": 4.0}, 205),
        ("leaky-rerope", {"window": 8, "k": 2.5}, 146),
    ],
)
def test_string_and_rerope_put_each_pair_at_the_papers_distance(method, params, length):
    """STRING: ``d`` below ``S``, ``d - S + W`` from ``S`` on (An et al. 2025, §4); ReRoPE: ``min(d, w)``; Leaky
    ReRoPE: ``d`` below ``w``, ``w + (d - w) / k`` past it (Su 2023, eqs. 3-4); each the reference's positions too.
    STRING's and Leaky ReRoPE's largest distance is below ``L`` up to their reach and not one token later; ReRoPE's
    is ``w`` at any length."""
    library = get_method(method).make_params(original_max_position_embeddings=L, **params)
    position = torch.arange(length + 1)
    i, j = position[:, None], position[None, :]
    distance = remap_distance(library, i, j).to(torch.float64)
    causal, d = j <= i, (i - j).to(torch.float64)
    if method == "string":
        paper = torch.where(d < params["shifted_offset"], d, d - params["shifted_offset"] + params["local_value"])
    elif method == "rerope":
        paper = d.clamp(max=params["window"])
    else:
        w, k = params["window"], params["k"]
        paper = torch.where(d < w, d, w + (d - w) / k)
    torch.testing.assert_close(distance[causal], paper[causal], rtol=0, atol=1e-9)
    query, key = ref.pair_positions(method, length + 1, **params)
    torch.testing.assert_close(distance[causal], (query - key)[causal], rtol=0, atol=1e-9)
    if method == "rerope":
        assert library.reach is None and distance.max() == params["window"]
    else:
        assert library.reach == length == library.max_position_embeddings
        assert distance[:length, :length].max() <= L - 1 < distance[length].max()


@pytest.mark.parametrize(
    ("method", "params", "turns"),
    [
        ("self-extend", {"group_size": 3, "window": 12}, 2),
        ("dca", {}, 2),  # three segments, two turns
        ("string", {"shifted_offset": 20, "local_value": 4}, 1),  # the shifted keys at their true positions
    ],
)
def test_segments_that_share_keys_put_them_at_the_same_positions(method, params, turns):
    """The backends turn the keys once for the segments ``key_source`` groups: each shares with an earlier
    (or its own) segment that puts its keys at the same positions (the true ones, or the same ``K_g(j)``)."""
    remap = get_method(method).make_params(original_max_position_embeddings=L, **params)
    position = torch.arange(4 * L)
    assert len(remap.KEY_SEGMENTS) == len(remap.SEGMENTS)
    assert len({remap.key_source(segment) for segment in range(len(remap.SEGMENTS))}) == turns
    for segment in range(len(remap.SEGMENTS)):
        source = remap.key_source(segment)
        assert source <= segment and remap.key_source(source) == source
        if source != segment:  # its keys as the source leaves them: unturned (true positions), or turned alike
            shared = position if remap.TRUE_DISTANCES[source] else remap.key_position(source, position)
            assert torch.equal(remap.key_position(segment, position), shared)


@pytest.mark.parametrize(
    ("case", "segment"),
    [("self-extend-g4-w16", 1), ("dca-48-4", 1), ("dca-48-4", 2), ("dca-20-15", 2)],
    ids=["self-extend-grouped", "dca-previous-chunk", "dca-earlier-chunks", "dca-20-15-earlier-chunks"],
)
def test_the_tolerance_resolves_an_off_by_one_position(monkeypatch, case, segment):
    """A reference whose queries sit one position further in a single far segment differs from the true one by
    far more than TOLERANCE: the comparisons above see an off-by-one anywhere (llama: the smallest effect)."""
    method, params, length = CASES[case]
    true_segments = ref.segments
    want = expected("llama", case)  # computed (and cached) with the true segments, whichever test asked first

    def shifted(*args, **kwargs):
        found = true_segments(*args, **kwargs)
        query, key, pairs = found[segment]
        assert pairs.any()
        found[segment] = (query + 1, key, pairs)
        return found

    monkeypatch.setattr(ref, "segments", shifted)
    moved = ref.reference_logits(make_tiny("llama"), tokens(length), method, **params)
    assert (moved - want).abs().max() > 100 * TOLERANCE["atol"]


@pytest.mark.parametrize(
    ("case", "wrong"),
    [("logn-qwen", {"original_max_position_embeddings": L + 1}), ("logn-llama4", {"floor_scale": 11})],
)
def test_the_tolerance_resolves_a_wrong_logn_factor(case, wrong):
    """log-n with L one larger (Qwen: a 0.4% smaller factor at p = 99) or floor_scale one larger (Llama 4) moves
    the logits by well over TOLERANCE."""
    method, params, length = CASES[case]
    params = {"original_max_position_embeddings": L, **params, **wrong}
    moved = ref.reference_logits(make_tiny("llama"), tokens(length), method, **params)
    assert (moved - expected("llama", case)).abs().max() > 20 * TOLERANCE["atol"]  # L + 1: 1.7e-5
