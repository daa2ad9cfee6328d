"""Chunked NLL against transformers' own loss and the transformers-docs sliding-window recipe."""

from __future__ import annotations

import math

import pytest
import torch
from accelerate import Accelerator
from helpers import SPECS, family_of
from tiny_models import make_tiny

import hf_posenc
from hf_posenc.eval.data import build_windows
from hf_posenc.eval.perplexity import (
    check_head_decomposition,
    each_call_alone,
    greedy_continuation,
    perplexity,
    window_nll,
)
from hf_posenc.eval.scoring import score_lengths
from hf_posenc.spec import MethodSpec

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gpt2"]


def _tiny64(family: str):
    return make_tiny(family).double()


def _ids(n: int, seed: int = 1, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, 97, (batch, n), generator=torch.Generator().manual_seed(seed))


def _labels_loss_sum(model, ids: torch.Tensor, score_from: int) -> float:
    """Summed NLL from a plain ``model(ids, labels=...)`` call: mean loss times the scored count."""
    labels = ids.clone()
    labels[:, :score_from] = -100
    with torch.no_grad():
        loss = model(input_ids=ids, labels=labels).loss.item()
    return loss * (ids.shape[1] - score_from) * ids.shape[0]


def _full_logits_sum(model, ids: torch.Tensor, score_from: int) -> float:
    """Summed NLL from the full logits of a plain forward, in the model's dtype (float64 here)."""
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[:, score_from - 1 : -1], dim=-1)
    return -logp.gather(-1, ids[:, score_from:, None]).sum().item()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("score_from", "chunk_size"), [(1, 7), (20, 3), (1, 4096)])
def test_chunked_nll_equals_labels_loss(family, score_from, chunk_size):
    model = _tiny64(family)
    ids = _ids(48, batch=2)
    ours = window_nll(model, ids, score_from, chunk_size)
    assert ours.shape == (2,)
    assert math.isclose(ours.sum().item(), _full_logits_sum(model, ids, score_from), rel_tol=1e-12)
    # transformers' labels= loss upcasts logits to float32 only
    assert math.isclose(ours.sum().item(), _labels_loss_sum(model, ids, score_from), rel_tol=1e-6)
    # each row is its own window
    assert math.isclose(ours[1].item(), _full_logits_sum(model, ids[1:], score_from), rel_tol=1e-12)


def test_float32_chunked_nll_within_1e4_of_labels_loss():
    model = make_tiny("llama")
    ids = _ids(60)
    assert math.isclose(window_nll(model, ids, 1, 16).item(), _labels_loss_sum(model, ids, 1), rel_tol=1e-4)


def test_a_dynamic_base_model_scores_each_window_as_if_alone():
    """transformers' ``dynamic`` rope type keeps the frequencies of the longest input seen until one shorter than L
    comes: a 100-token window read after a 128-token one would get the 128-token frequencies (L = 64)."""
    rope = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    fresh, used = (make_tiny("llama", rope_parameters=dict(rope)) for _ in range(2))
    short, long = _ids(100), _ids(128, seed=2)
    expected = window_nll(fresh, short, 1)
    window_nll(used, long, 1)
    assert torch.equal(window_nll(used, short, 1), expected)
    greedy_continuation(used, long, 1)
    assert torch.equal(window_nll(used, short, 1), expected)


def test_each_call_alone_puts_the_dynamic_state_back_before_each_call():
    """What lm-eval runs through the model's own forward (its requests longest first)."""
    rope = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    fresh, used = (make_tiny("llama", rope_parameters=dict(rope)) for _ in range(2))
    short, long = _ids(100), _ids(128, seed=2)
    with torch.no_grad():
        expected = fresh(short).logits
        used(long)
        assert not torch.equal(used(short).logits, expected)  # transformers' state: the 128-token frequencies
        with each_call_alone(used):
            used(long)
            assert torch.equal(used(short).logits, expected)
        assert not used._forward_pre_hooks


def test_no_future_token_in_context():
    """Each scored token's NLL equals the NLL from a forward over its prefix only."""
    model = _tiny64("llama")
    ids = _ids(24)
    score_from = 5
    total = 0.0
    for p in range(score_from, ids.shape[1]):
        with torch.no_grad():
            logits = model(input_ids=ids[:, : p + 1]).logits[0, -2]
        total -= torch.log_softmax(logits, -1)[ids[0, p]].item()
    assert math.isclose(window_nll(model, ids, score_from, 5).item(), total, rel_tol=1e-9)
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] + 1) % 97
    prefix_only = window_nll(model, ids[:, :-1], score_from).item()
    assert math.isclose(window_nll(model, changed[:, :-1], score_from).item(), prefix_only, rel_tol=1e-12)


def _docs_recipe(model, encodings: torch.Tensor, max_length: int, stride: int) -> float:
    """The sliding-window loop of the transformers docs ("Perplexity of fixed-length models").

    One deliberate change: the docs weight each window's mean loss by ``valid labels - 1``, but the
    shift drops a label only in the first window (later windows' first label is already -100), so we
    weight by the tokens the loss actually averaged over.
    """
    seq_len = encodings.size(1)
    nll_sum, n_tokens, prev_end_loc = 0.0, 0, 0
    for begin_loc in range(0, seq_len, stride):
        end_loc = min(begin_loc + max_length, seq_len)
        trg_len = end_loc - prev_end_loc
        input_ids = encodings[:, begin_loc:end_loc]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        with torch.no_grad():
            neg_log_likelihood = model(input_ids, labels=target_ids).loss
        num_loss_tokens = (target_ids[:, 1:] != -100).sum().item()
        nll_sum += neg_log_likelihood.item() * num_loss_tokens
        n_tokens += num_loss_tokens
        prev_end_loc = end_loc
        if end_loc == seq_len:
            break
    return math.exp(nll_sum / n_tokens)


def _our_ppl(model, doc: list[int], length: int, protocol: str, stride: int | None = None, batch_size: int = 1):
    plan = build_windows([len(doc)], length, protocol, bos=False, stride=stride)
    accelerator = Accelerator(cpu=True)
    scored = score_lengths(model, [doc], {length: plan.windows}, accelerator=accelerator, batch_size=batch_size)[length]
    return perplexity(sum(r[0] for r in scored.windows), sum(r[1] for r in scored.windows))[1], scored.windows


@pytest.mark.parametrize(("length", "stride"), [(32, 8), (48, 16), (40, 40), (64, 23)])
def test_sliding_equals_transformers_docs_recipe(length, stride):
    model = _tiny64("llama")
    doc = _ids(203, seed=3)
    ours, scored = _our_ppl(model, doc[0].tolist(), length, "sliding", stride, batch_size=3)
    # the recipe's labels= loss takes log-softmax in float32 even for a float64 model
    assert math.isclose(ours, _docs_recipe(model, doc, length, stride), rel_tol=1e-6)
    assert sum(r[1] for r in scored) == 202 - (202 // stride if stride == length else 0)


@pytest.mark.parametrize("protocol", ["disjoint", "truncate"])
def test_disjoint_and_truncate_equal_labels_loss_on_the_same_windows(protocol):
    model = make_tiny("qwen2")  # float32: the 1e-4 tolerance
    doc = _ids(150, seed=4)
    ours, scored = _our_ppl(model, doc[0].tolist(), 32, protocol, batch_size=2)
    spans = [doc[:, k * 32 : (k + 1) * 32] for k in range(len(scored))]
    nll = sum(_labels_loss_sum(model, span, 1) for span in spans)
    assert len(scored) == (4 if protocol == "disjoint" else 1)
    assert math.isclose(ours, math.exp(nll / (31 * len(spans))), rel_tol=1e-4)


@pytest.mark.parametrize("chunk_size", [1, 2, 2048])
def test_greedy_continuation_is_greedy_decoding(chunk_size):
    model = _tiny64("llama")
    prompt = _ids(20, seed=5)
    generated = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)  # (1, 24)
    matches, after = greedy_continuation(model, generated[:, :-1], 20, chunk_size)
    assert matches.item() and after.item() == generated[0, -1].item()
    wrong = generated[:, :-1].clone()
    wrong[0, -1] = (wrong[0, -1] + 1) % 97
    assert not greedy_continuation(model, wrong, 20, chunk_size)[0].item()


def test_head_decomposition_check_rejects_scaled_logits():
    model = make_tiny("llama")
    check_head_decomposition(model, _ids(16))
    original = model.forward

    def scaled(*args, **kwargs):
        out = original(*args, **kwargs)
        out.logits = out.logits * 2
        return out

    model.forward = scaled
    with pytest.raises(NotImplementedError, match="computes logits differently"):
        check_head_decomposition(model, _ids(16))


def test_every_registered_method_is_covered():
    import hf_posenc

    assert sorted(SPECS) == hf_posenc.available_methods()


@pytest.mark.parametrize("method", sorted(SPECS))
def test_eval_under_each_method_changes_the_score_and_restores_the_model(method):
    """128 tokens past the tiny model's 64 (GPT-2: its 64): every method changes the NLL; leaving it restores it
    exactly."""
    model = make_tiny(family_of(method))
    ids = _ids(64 if family_of(method) == "gpt2" else 128, seed=7)  # the unpatched GPT-2 takes its 64 positions
    base = window_nll(model, ids, 1).item()
    spec = MethodSpec.parse(SPECS[method])
    with hf_posenc.patched(model, spec.method, **spec.params):
        params = hf_posenc.get_patch(model).params
        patched = window_nll(model, ids, 1).item()
    assert params is not None and patched != base and math.isfinite(patched)
    assert window_nll(model, ids, 1).item() == base


def test_perplexity_is_the_exponential_of_the_mean_and_inf_past_float_range():
    assert perplexity(6.0, 3) == (2.0, math.exp(2.0))
    assert perplexity(2000.0, 2) == (1000.0, math.inf)  # exp(1000) overflows a float: a diverged model
    assert all(map(math.isnan, perplexity(math.nan, 2)))  # a numerical failure, not a diverged model
    with pytest.raises(ValueError, match="No token was scored"):
        perplexity(1.0, 0)
