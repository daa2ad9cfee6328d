"""Dynamic methods and the KV cache (transformers issue #25104): the semantics, pinned.

With a cache, a dynamic method rotates each token with the frequencies of the length at which it was
written (``max(position + 1, prompt length)``); keys already cached keep their rotation. So greedy
generation with the cache equals recomputing the whole sequence while the length stays within the
trained context ``L``, and differs past it, where recomputation re-rotates every key with the
frequencies of the new length. The cached result is pinned against an independent computation: one
full forward whose rotary embedding uses, for each position, the frequencies of its write length.
"""

from __future__ import annotations

import pytest
import torch
from helpers import generate
from tiny_models import make_tiny

import hf_posenc

L, NEW = 64, 60
DYNAMIC = [("dynamic-ntk", {"factor": 4}), ("dynamic-yarn", {})]


def recompute(model, sequence: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """No cache: the whole prefix again for each new token; the logits that chose token t."""
    with torch.no_grad():
        steps = [model(sequence[:, :t], use_cache=False).logits[:, -1] for t in range(prompt_len, sequence.shape[1])]
    return torch.stack(steps, dim=1)


def write_length_rotary(rotary, method, params, prompt_len):
    """A rotary forward where position p uses the frequencies for length max(p + 1, prompt_len)."""
    head_dim = 2 * rotary.inv_freq.numel()
    base = rotary.config.rope_parameters["rope_theta"]

    def forward(x, position_ids):
        rows, factors = [], []
        for position in position_ids[0].tolist():
            inv_freq, factor = hf_posenc.rope_frequencies(
                method,
                head_dim=head_dim,
                base=base,
                original_max_position_embeddings=L,
                seq_len=max(position + 1, prompt_len),
                **params,
            )
            rows.append(position * inv_freq)
            factors.append(factor)
        angles = torch.stack(rows)  # (T, d/2)
        emb = torch.cat((angles, angles), dim=-1)
        scale = torch.tensor(factors, dtype=torch.float64)[:, None]
        return (emb.cos() * scale)[None].to(x.dtype), (emb.sin() * scale)[None].to(x.dtype)

    return forward


@pytest.mark.parametrize("prompt_len", [40, 80])  # prefill inside L, and already past it
@pytest.mark.parametrize(("method", "params"), DYNAMIC)
def test_cached_generation_rotates_each_token_at_its_write_length(method, params, prompt_len):
    model = make_tiny("llama")
    prompt = torch.randint(0, 97, (1, prompt_len), generator=torch.Generator().manual_seed(3))
    hf_posenc.patch(model, method, **params)
    sequence, cached = generate(model, prompt, new=NEW)
    assert sequence.shape[1] == prompt_len + NEW > L

    recomputed = recompute(model, sequence, prompt_len)
    within = [t for t in range(NEW) if prompt_len + t <= L]  # logits that chose token at length <= L
    torch.testing.assert_close(cached[:, within], recomputed[:, within], rtol=1e-4, atol=1e-4)
    past = (cached - recomputed).abs().amax(dim=-1)[0, len(within) + 1 :]
    # past L, recomputation re-rotates the cached keys; the cache does not
    assert (past > 1e-5).all() and past.max() > 1e-3

    rotary = model.model.rotary_emb
    rotary.forward = write_length_rotary(rotary, method, params, prompt_len)
    with torch.no_grad():
        reference = model(sequence[:, :-1], use_cache=False).logits[:, prompt_len - 1 :]
    torch.testing.assert_close(cached, reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("method", "params"), [("yarn", {"factor": 4}), ("longrope", {"factor": 4, "long_factor": [2.0] * 8})]
)
def test_static_methods_cache_equals_recompute_within_each_regime(method, params):
    """Static frequencies: cache == no cache. LongRoPE switches factor sets at L, so it is pinned on
    a prompt that is already past L (one regime for the whole generation)."""
    model = make_tiny("llama")
    prompt = torch.randint(0, 97, (1, 70), generator=torch.Generator().manual_seed(4))
    hf_posenc.patch(model, method, **params)
    sequence, cached = generate(model, prompt, new=NEW)
    torch.testing.assert_close(cached, recompute(model, sequence, 70), rtol=1e-4, atol=1e-4)


def test_dynamic_patch_is_stateless_across_calls():
    """Unlike transformers' own dynamic update, an earlier long forward does not change a later short one."""
    model = make_tiny("llama")
    hf_posenc.patch(model, "dynamic-ntk", factor=4)
    ids = torch.randint(0, 97, (1, 100), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        fresh = model(ids[:, :90]).logits
        model(ids)  # a longer sequence in between
        again = model(ids[:, :90]).logits
    assert torch.equal(fresh, again)
