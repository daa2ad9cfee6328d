"""GPT-2 (learned positions): ALiBi with wpe silenced, and PI as a resampled wpe table."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import (
    assert_left_padded_batch_generates_as_each_alone,
    assert_refused,
    assert_same,
    generate,
    paper_slopes,
    plain_load,
    snapshot,
)
from tiny_models import make_tiny

import hf_posenc

N = 64  # the tiny GPT-2's n_positions


def ids_of(length: int, seed: int = 0, batch: int = 1) -> torch.Tensor:
    return torch.randint(1, 97, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("method", "params"), [("alibi", {}), ("alibi", {"backend": "eager"}), ("pi", {"factor": 4})])
def test_patch_and_unpatch_bit_for_bit(method, params):
    model = make_tiny("gpt2")
    ids = ids_of(50)
    with torch.no_grad():
        reference = model(ids).logits
    before = snapshot(model)
    hf_posenc.patch(model, method, **params)
    with torch.no_grad():
        assert (model(ids).logits - reference).abs().max() > 1e-3
    hf_posenc.unpatch(model)
    assert_same(before, snapshot(model))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference)


def test_alibi_wpe_contributes_nothing():
    model = make_tiny("gpt2")
    hf_posenc.patch(model, "alibi")
    ids = ids_of(40)
    with torch.no_grad():
        first = model(ids).logits
        model.transformer.wpe.weight.normal_()  # any table: it is not read
        assert torch.equal(model(ids).logits, first)
        assert torch.equal(model.transformer.wpe(torch.arange(5000)), torch.zeros(5000, 64))


@pytest.mark.parametrize("backend", ["eager", "sdpa", "flex"])
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_alibi_zero_query_key_makes_scores_pure_bias(backend):
    """q = k = 0: the attention output is softmax(-m_h (i - j)) over real earlier tokens applied to v."""
    model = make_tiny("gpt2")
    hf_posenc.patch(model, "alibi", backend=backend)
    for block in model.transformer.h:
        block.attn.c_attn.weight.data[:, :128] = 0  # Conv1D (in, 3E): q and k columns
        block.attn.c_attn.bias.data[:128] = 0
    ids = ids_of(12, batch=2)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    seen = {}
    attention = model.transformer.h[1].attn
    attention.register_forward_pre_hook(lambda m, a, kw: seen.update(hidden=a[0]), with_kwargs=True)
    attention.c_proj.register_forward_pre_hook(lambda m, a: seen.update(out=a[0]))
    with torch.no_grad():
        model(ids, attention_mask=mask)
        value = attention.c_attn(seen["hidden"])[..., 128:].double().view(2, 12, 4, 16)  # (B, T, H, D)
    position = mask.cumsum(-1)
    distance = (position[:, :, None] - position[:, None, :]).double()  # (B, i, j)
    allowed = (torch.arange(12)[:, None] >= torch.arange(12)[None, :]) & mask[:, None, :].bool()
    slopes = torch.tensor(paper_slopes(4), dtype=torch.float64)
    logits = (-slopes[None, :, None, None] * distance[:, None]).masked_fill(~allowed[:, None], -math.inf)
    expected = torch.einsum("bhij,bjhd->bihd", torch.softmax(logits, -1), value).reshape(2, 12, 64)
    torch.testing.assert_close(seen["out"][mask.bool()].double(), expected[mask.bool()], rtol=0, atol=2e-6)


def test_pi_resamples_the_table_as_the_paper_says():
    model = make_tiny("gpt2")
    original = model.transformer.wpe.weight.detach().clone()
    hf_posenc.patch(model, "pi", factor=4)
    table = model.transformer.wpe.weight
    assert table.shape == (4 * N, 64) and model.config.n_positions == 4 * N
    assert model.config.max_position_embeddings == 4 * N
    assert torch.equal(table[0::4], original)  # row s*k is trained row k (f'(m) = f(m / s))
    torch.testing.assert_close(table[2 : 4 * (N - 1) : 4], (original[:-1] + original[1:]) / 2, rtol=0, atol=1e-6)
    torch.testing.assert_close(table[1:-4:4], 0.75 * original[:-1] + 0.25 * original[1:], rtol=0, atol=1e-6)
    assert torch.equal(table[-3:], original[-1:].expand(3, -1))  # past the last trained row: that row
    info = hf_posenc.get_patch(model)
    assert info.params == {"original_max_position_embeddings": N, "factor": 4.0} and info.native
    assert model.config.hf_posenc["baked"] and model.config.hf_posenc["base"] == {"n_positions": N}


def test_pi_unpatch_follows_a_dtype_move():
    model = make_tiny("gpt2")
    original = model.transformer.wpe.weight.detach().clone()
    hf_posenc.patch(model, "pi", factor=2)
    model.to(torch.float64)
    hf_posenc.unpatch(model)
    restored = model.transformer.wpe.weight
    assert isinstance(restored, torch.nn.Parameter) and restored.dtype == torch.float64
    assert torch.equal(restored, original.double()) and model.config.n_positions == N


@pytest.mark.parametrize(("method", "params"), [("alibi", {"backend": "sdpa"}), ("pi", {"factor": 3})])
def test_3000_tokens_run_past_the_1024_table(method, params):
    model = make_tiny("gpt2", n_positions=1024)
    ids = ids_of(3000)
    with pytest.raises(IndexError), torch.no_grad():
        model(ids)
    hf_posenc.patch(model, method, **params)
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, 3000, 97) and torch.isfinite(logits).all()


def test_alibi_cached_generation_equals_recomputation_past_n_positions():
    model = make_tiny("gpt2")
    hf_posenc.patch(model, "alibi", backend="eager")
    sequence, cached = generate(model, ids_of(30, seed=1), new=60)
    assert sequence.shape[1] == 90 > N
    steps = list(range(0, 60, 6))
    with torch.no_grad():
        recomputed = torch.stack([model(sequence[:, : 30 + t], use_cache=False).logits[:, -1] for t in steps], 1)
    torch.testing.assert_close(cached[:, steps], recomputed, rtol=1e-4, atol=1e-4)


def test_alibi_left_padded_batch_generates_as_each_sequence_alone():
    model = make_tiny("gpt2")
    hf_posenc.patch(model, "alibi", backend="sdpa")
    long, short = ids_of(20, seed=2), ids_of(11, seed=3)
    assert_left_padded_batch_generates_as_each_alone(model, long, short)


def test_saved_configs_round_trip_alibi_refused_and_pi_native_without_hf_posenc(tmp_path):
    ids = ids_of(150)
    torch.save(ids, tmp_path / "ids.pt")
    logits = {}
    for method, params in [("alibi", {"backend": "eager"}), ("pi", {"factor": 4})]:
        model = make_tiny("gpt2")
        hf_posenc.patch(model, method, **params)
        with torch.no_grad():
            logits[method] = model(ids).logits
        model.save_pretrained(tmp_path / method)
        loaded = hf_posenc.from_pretrained(str(tmp_path / method), attn_implementation="eager").eval()
        with torch.no_grad():
            assert torch.equal(loaded(ids).logits, logits[method])
    alibi = hf_posenc.from_pretrained(str(tmp_path / "alibi"))
    assert hf_posenc.get_patch(alibi).params["slopes"] == paper_slopes(4)
    hf_posenc.unpatch(alibi)
    assert (
        alibi.config.activation_function == "gelu_new" and alibi.config._attn_implementation != "hf_posenc_alibi_eager"
    )
    pi = hf_posenc.from_pretrained(str(tmp_path / "pi"))
    assert hf_posenc.get_patch(pi) is None and pi.config.n_positions == 4 * N  # baked: a plain longer GPT-2
    plain = plain_load(str(tmp_path / "ids.pt"), str(tmp_path / "alibi"), str(tmp_path / "pi"))
    assert plain[str(tmp_path / "alibi")].startswith("KeyError") and "hf_posenc_alibi" in plain[str(tmp_path / "alibi")]
    assert plain[str(tmp_path / "pi")] == "loaded"
    assert torch.equal(torch.load(tmp_path / "pi" / "plain_logits.pt"), logits["pi"])


BAD = [
    ("pi factor below one", "pi", {"factor": 0.5}, ValueError, "shrink"),
    ("pi factor nan", "pi", {"factor": float("nan")}, ValueError, "finite"),
    ("pi wrong context", "pi", {"factor": 2, "original_max_position_embeddings": 32}, ValueError, "position table has 64 rows"),
    ("rope method", "yarn", {"factor": 4}, ValueError, r"encodes position as learned \(transformer.wpe\); method 'yarn' needs rotary embeddings"),
    ("unknown backend", "alibi", {"backend": "triton"}, ValueError, "Unknown ALiBi backend 'triton'"),
    ("pi table too large", "pi", {"factor": 1e6}, ValueError, r"^factor=1000000.0 would resample the position table from 64 to 64,000,000 rows of 64 \(15.2588 GiB in float32\); hf_posenc builds tables of at most 1 GiB: 4,194,304 rows here, factor <= 6.554e\+04.$"),
    ("pi table just too large", "pi", {"factor": 65537}, ValueError, r"to 4,194,368 rows of 64 \(1.00002 GiB in float32\); hf_posenc builds tables of at most 1 GiB"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "method", "params", "error", "match"), BAD, ids=[case[0] for case in BAD])
def test_bad_input_raises_and_changes_nothing(case, method, params, error, match):
    assert_refused(make_tiny("gpt2"), method, params, error, match)
