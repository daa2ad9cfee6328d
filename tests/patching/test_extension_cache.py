"""Self-Extend, DCA, STRING, ReRoPE, Leaky ReRoPE and log-n (alone and combined) with the KV cache and with padding, on the tiny models (L = 64).

The remaps re-rotate cached keys on the fly and take positions from the attention mask, so what they compute must
not depend on how the sequence reaches the model: greedy generation with a dynamic or a static cache equals
recomputing the whole prefix at every step, a forward fed piece by piece through a cache equals one full forward,
and a left-padded batch equals each sequence alone. Lengths cross L = 64, Self-Extend's window (16) and DCA's chunk
boundaries (chunks of 48 - 4 = 44 tokens: 44, 88).
"""

from __future__ import annotations

import inspect

import pytest
import torch
from helpers import generate
from tiny_models import make_tiny
from transformers import DynamicCache, StaticCache

import hf_posenc
from hf_posenc.attention import extension_blocks

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
    pytest.mark.filterwarnings("ignore:.*generation flags are not valid.*"),
]


L = 64
SE = {"group_size": 4, "window": 16}  # reaches (64 - 16) * 4 + 16 = 208 tokens
DCA = {"chunk_size": 48, "local_size": 4}  # chunks of 44 tokens
STRING = {"shifted_offset": 40, "local_value": 8}  # reaches 64 + 40 - 8 = 96 tokens
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}

# (method, params, family, base attention implementation): remaps on the CPU backends, log-n on eager and sdpa.
CASES = {
    "self-extend-blocked": ("self-extend", {**SE, "backend": "blocked"}, "llama", "eager"),
    "self-extend-eager": ("self-extend", {**SE, "backend": "eager"}, "qwen3", "eager"),
    "dca-blocked": ("dca", {**DCA, "backend": "blocked"}, "qwen2", "eager"),
    "dca-eager": ("dca", {**DCA, "backend": "eager"}, "mistral", "eager"),
    "self-extend-sdpa": ("self-extend", {**SE, "backend": "sdpa"}, "qwen2", "eager"),
    "dca+logn-sdpa": ("dca+logn", {**DCA, "backend": "sdpa"}, "llama", "eager"),
    "logn-eager": ("logn", {}, "llama", "eager"),
    "logn-sdpa": ("logn", {}, "qwen2", "sdpa"),
    "self-extend+logn-blocked": ("self-extend+logn", {**SE, "backend": "blocked"}, "llama", "eager"),
    "self-extend+logn-eager": ("self-extend+logn", {**SE, "backend": "eager"}, "qwen2", "eager"),
    "yarn+logn": ("yarn+logn", {"factor": 2}, "mistral", "sdpa"),
    "string-sdpa": ("string", {**STRING, "backend": "sdpa"}, "qwen3", "eager"),
    "rerope+logn-blocked": ("rerope+logn", {"window": 16, "backend": "blocked"}, "mistral", "eager"),
    "leaky-rerope-eager": ("leaky-rerope", {"window": 16, "k": 4.0, "backend": "eager"}, "llama", "eager"),
}


def tiny(family: str, implementation: str = "eager"):
    """A tiny model with weights 2.5x the default scale: sharper attention, so that each method moves the logits
    by 1e-2 or more (log-n by ~4e-4 at the default scale), far above the 1e-5 tolerance below."""
    return make_tiny(family, attn_implementation=implementation, initializer_range=0.05)


def patched_tiny(case: str):
    method, params, family, implementation = CASES[case]
    model = tiny(family, implementation)
    return hf_posenc.patch(model, method, original_max_position_embeddings=L, **params)


def tokens(length: int, seed: int) -> torch.Tensor:
    """(1, length) token ids from 1 .. 96 (0 is left for padding)."""
    return torch.randint(1, 97, (1, length), generator=torch.Generator().manual_seed(seed))


def greedy(model, prompt: torch.Tensor, new: int, mask: torch.Tensor | None = None, **kwargs):
    """Greedy generation of ``new`` tokens: (sequences, logits (B, new, V))."""
    return generate(model, prompt, mask, new, **kwargs)


def test_the_cases_change_the_model_past_the_context():
    """Guard for everything below: each patched model differs from the unpatched one on a long input (else the
    cache and padding comparisons would pass on the base model too)."""
    ids = tokens(100, seed=1)
    for case, (_, _, family, implementation) in CASES.items():
        with torch.no_grad():
            base = tiny(family, implementation)(ids).logits
            patched = patched_tiny(case)(ids).logits
        assert (patched - base).abs().max() > 1e-2, case


STATIC = ["self-extend-blocked", "dca-eager", "logn-sdpa", "self-extend+logn-blocked", "yarn+logn", "string-sdpa"]
GENERATION = [(case, "dynamic") for case in sorted(CASES)] + [(case, "static") for case in STATIC]


def recomputed(model, sequence: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """The logits that chose each generated token, from one forward over the whole sequence without cache
    (attention is causal, so row t sees what recomputing the prefix up to t would)."""
    with torch.no_grad():
        return model(sequence[:, :-1], use_cache=False).logits[:, prompt_len - 1 :]


@pytest.mark.parametrize(("case", "cache"), GENERATION)
def test_cached_generation_equals_recomputation(case, cache):
    """Greedy tokens and their logits with the cache equal those recomputed without it, from a 30-token prompt
    to 92 tokens: past L and both DCA chunk boundaries."""
    model = patched_tiny(case)
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    sequence, cached = greedy(model, tokens(30, seed=2), 62, **extra)
    assert sequence.shape[1] == 92
    expected = recomputed(model, sequence, 30)
    torch.testing.assert_close(cached, expected, **TOLERANCE)
    assert torch.equal(sequence[:, 30:], expected.argmax(-1))


@pytest.mark.parametrize("case", ["self-extend-blocked", "dca-eager", "logn-sdpa"])
def test_cached_generation_equals_generation_without_cache(case):
    """The same through generate() itself: use_cache=False recomputes the whole prefix at every step."""
    model = patched_tiny(case)
    prompt = tokens(40, seed=3)
    sequence, cached = greedy(model, prompt, 50)
    again, without = greedy(model, prompt, 50, use_cache=False)
    assert torch.equal(sequence, again)
    torch.testing.assert_close(cached, without, **TOLERANCE)


def test_cached_flex_generation_equals_eager():
    """The flex backend (uncompiled on CPU, under no_grad as generate runs) through the cache: the same tokens
    and logits as the eager reference without cache; from 60 tokens to 90 (past L and DCA's chunk at 88)."""
    flex = hf_posenc.patch(tiny("llama"), "dca", original_max_position_embeddings=L, backend="flex", **DCA)
    eager = hf_posenc.patch(tiny("llama"), "dca", original_max_position_embeddings=L, backend="eager", **DCA)
    sequence, cached = greedy(flex, tokens(60, seed=3), 30)
    expected = recomputed(eager, sequence, 60)
    torch.testing.assert_close(cached, expected, **TOLERANCE)
    assert torch.equal(sequence[:, 60:], expected.argmax(-1))


CHUNKS = [37, 1, 1, 6, 1, 19, 1, 4, 18, 1, 11]  # 100 tokens; pieces straddle 44, 64 and 88


def _fed_in_pieces(model, ids: torch.Tensor, cache) -> torch.Tensor:
    # transformers 5.24 renamed forward's past_key_values to cache (the old name warns, and goes in 5.40)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    logits, start = [], 0
    with torch.no_grad():
        for size in CHUNKS:
            piece = slice(start, start + size)
            out = model(
                ids[:, piece],
                **{name: cache},
                use_cache=True,
                cache_position=torch.arange(start, start + size),
            )
            logits.append(out.logits)
            start += size
    assert start == ids.shape[1]
    return torch.cat(logits, 1)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_fed_piece_by_piece_equals_one_forward(case, cache):
    """Logits of a 100-token sequence fed through the cache in pieces of 1 to 37 tokens (queries starting
    anywhere, not only at 0 or at the last position) equal one full forward without cache."""
    model = patched_tiny(case)
    ids = tokens(100, seed=4)
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
    made = DynamicCache(config=model.config) if cache == "dynamic" else StaticCache(model.config, max_cache_len=100)
    torch.testing.assert_close(_fed_in_pieces(model, ids, made), full, **TOLERANCE)


def test_flex_forward_fed_piece_by_piece_equals_eager():
    """Flex with the cache (the block masks built per call, queries offset) against eager without it."""
    flex = hf_posenc.patch(tiny("qwen3"), "self-extend+logn", original_max_position_embeddings=L, backend="flex", **SE)
    eager = hf_posenc.patch(
        tiny("qwen3"), "self-extend+logn", original_max_position_embeddings=L, backend="eager", **SE
    )
    ids = tokens(100, seed=5)
    with torch.no_grad():
        full = eager(ids, use_cache=False).logits
    torch.testing.assert_close(_fed_in_pieces(flex, ids, DynamicCache(config=flex.config)), full, **TOLERANCE)


# Padding: positions count the real tokens of each row.


def left_padded(long: torch.Tensor, short: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    pad = long.shape[1] - short.shape[1]
    batch = torch.cat([long, torch.cat([torch.zeros(1, pad, dtype=torch.long), short], 1)])
    mask = (torch.arange(long.shape[1]) >= torch.tensor([[0], [pad]])).long()
    return batch, mask


@pytest.mark.parametrize("case", sorted(CASES))
def test_left_padded_batch_forward_equals_each_alone(case):
    """A left-padded batch of a 100- and a 71-token sequence, position_ids as generate() makes them
    (``cumsum - 1`` clamped at 0): on the real tokens, each row's logits are its own alone."""
    model = patched_tiny(case)
    long, short = tokens(100, seed=6), tokens(71, seed=7)
    batch, mask = left_padded(long, short)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        together = model(batch, attention_mask=mask, position_ids=position_ids).logits
        for row, alone in enumerate([long, short]):
            real = mask[row].bool()
            torch.testing.assert_close(together[row, real], model(alone).logits[0], **TOLERANCE)


@pytest.mark.parametrize("case", ["logn-eager", "logn-sdpa", "yarn+logn", "self-extend-blocked", "dca+logn-sdpa"])
def test_left_padded_batch_forward_without_position_ids_equals_each_alone(case):
    """The same batch with no position_ids (a tokenizer's padded batch passed as it is): the patch counts the
    positions over the mask, as generate() does, where the model would count the padding too (log-n would then
    scale the short row's queries by its padded index)."""
    model = patched_tiny(case)
    long, short = tokens(100, seed=6), tokens(71, seed=7)
    batch, mask = left_padded(long, short)
    with torch.no_grad():
        together = model(batch, attention_mask=mask).logits
        for row, alone in enumerate([long, short]):
            torch.testing.assert_close(together[row, mask[row].bool()], model(alone).logits[0], **TOLERANCE)


@pytest.mark.parametrize("case", ["self-extend-blocked", "dca-eager", "self-extend+logn-blocked"])
def test_right_padded_batch_forward_equals_each_alone(case):
    """Right padding, with generate()'s position_ids (``cumsum - 1``, padding set to 1): the padding queries'
    positions are not checked, and the real tokens' logits are each row's own."""
    model = patched_tiny(case)
    long, short = tokens(100, seed=6), tokens(71, seed=7)
    batch = torch.zeros(2, 100, dtype=torch.long)
    batch[0], batch[1, :71] = long[0], short[0]
    mask = torch.zeros_like(batch)
    mask[0], mask[1, :71] = 1, 1
    position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    with torch.no_grad():
        together = model(batch, attention_mask=mask, position_ids=position_ids).logits
        for row, alone in enumerate([long, short]):
            real = mask[row].bool()
            torch.testing.assert_close(together[row, real], model(alone).logits[0], **TOLERANCE)


@pytest.mark.parametrize(
    ("case", "cache"),
    [("self-extend-blocked", "dynamic"), ("dca-eager", "dynamic"), ("logn-sdpa", "dynamic"), ("yarn+logn", "dynamic")]
    + [("self-extend+logn-blocked", "static"), ("leaky-rerope-eager", "dynamic"), ("string-sdpa", "static")],
)
def test_left_padded_batch_generates_as_each_alone(case, cache):
    """generate() on a left-padded batch (prompts of 50 and 33 tokens, 45 new ones: past L and DCA's chunk at 88
    for the longer one) gives each sequence its own greedy tokens and logits."""
    model = patched_tiny(case)
    long, short = tokens(50, seed=8), tokens(33, seed=9)
    batch, mask = left_padded(long, short)
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    sequences, logits = greedy(model, batch, 45, mask, **extra)
    for row, alone in enumerate([long, short]):
        alone_sequence, alone_logits = greedy(model, alone, 45, **extra)
        assert torch.equal(sequences[row, -45:], alone_sequence[0, -45:]), row
        torch.testing.assert_close(logits[row], alone_logits[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("case", "cache"),
    [("self-extend-blocked", "dynamic"), ("dca-eager", "dynamic"), ("logn-sdpa", "dynamic")]
    + [("self-extend+logn-blocked", "static")],
)
def test_a_batch_with_an_empty_prompt_generates_each_row_as_alone(case, cache):
    """generate() on a left-padded batch whose second prompt is empty (all padding, as a tokenizer that adds no
    BOS pads ""): generate() counts that row's tokens from 1 (the only offset from the count
    taken, and only in a row that starts with padding), with no ValueError at the first step. Each row's
    tokens and logits are its own: the empty row's from its first token on equal generating from that token alone
    (80 tokens: past L, the window and DCA's first chunk)."""
    model = patched_tiny(case)
    prompt = tokens(20, seed=14)
    batch = torch.cat([prompt, torch.zeros_like(prompt)])
    mask = torch.cat([torch.ones_like(prompt), torch.zeros_like(prompt)])
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    sequences, logits = greedy(model, batch, 80, mask, **extra)
    alone_sequence, alone_logits = greedy(model, prompt, 80, **extra)
    assert torch.equal(sequences[0], alone_sequence[0])
    torch.testing.assert_close(logits[0], alone_logits[0], rtol=1e-4, atol=1e-4)
    empty_sequence, empty_logits = greedy(model, sequences[1:, 20:21], 79, **extra)
    assert torch.equal(sequences[1, 20:], empty_sequence[0])
    torch.testing.assert_close(logits[1, 1:], empty_logits[0], rtol=1e-4, atol=1e-4)


def test_flex_left_padded_batch_equals_eager():
    """Flex's block masks follow each row's positions: the eager reference's logits on the real tokens."""
    model = hf_posenc.patch(tiny("llama"), "self-extend", original_max_position_embeddings=L, backend="flex", **SE)
    long, short = tokens(80, seed=10), tokens(57, seed=11)
    batch, mask = left_padded(long, short)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    reference = hf_posenc.patch(tiny("llama"), "self-extend", original_max_position_embeddings=L, backend="eager", **SE)
    with torch.no_grad():
        flex = model(batch, attention_mask=mask, position_ids=position_ids).logits
        eager = reference(batch, attention_mask=mask, position_ids=position_ids).logits
    torch.testing.assert_close(flex[mask.bool()], eager[mask.bool()], **TOLERANCE)


@pytest.mark.parametrize(
    "case", ["self-extend-blocked", "dca-eager", "self-extend+logn-blocked", "logn-sdpa", "yarn+logn"]
)
def test_positions_that_do_not_count_real_tokens_are_refused(case):
    """The methods read positions from the mask: a padded batch given position_ids 0..n-1 in every row, or ones that
    restart inside a row (packed sequences), or a later call that restarts after the cached tokens, or an offset
    in a row without padding beside a padded one: the rotary embedding would disagree with the mask (and a call sees
    only its own tokens, so an offset may differ from the cached keys'). A ValueError, not silently other logits."""
    model = patched_tiny(case)
    long, short = tokens(90, seed=12), tokens(71, seed=13)
    batch, mask = left_padded(long, short)
    error = r"position_ids must count the non-padding tokens"
    with torch.no_grad():
        for position_ids in [torch.arange(90), torch.cat([torch.arange(45), torch.arange(45)])]:
            with pytest.raises(ValueError, match=error):
                model(batch, attention_mask=mask, position_ids=position_ids.expand(2, -1))
            with pytest.raises(ValueError, match=error):
                model.model(batch, mask, position_ids[None])  # positionally, to the decoder itself
        shifted = (mask.cumsum(-1) - 1).clamp(min=0)
        shifted[0] += 5  # the unpadded row counted from 5
        with pytest.raises(ValueError, match=error):
            model(batch, attention_mask=mask, position_ids=shifted)
        cache = DynamicCache(config=model.config)
        model(batch[:, :70], attention_mask=mask[:, :70], past_key_values=cache)
        with pytest.raises(ValueError, match=error):  # the second call counted from 0 again
            model(batch[:, 70:], attention_mask=mask, past_key_values=cache, position_ids=torch.arange(20)[None])


@pytest.mark.parametrize(
    "case", ["self-extend+logn-blocked", "dca-blocked", "self-extend-sdpa", "dca+logn-sdpa", "rerope+logn-blocked"]
)
def test_query_block_backends_across_many_blocks(monkeypatch, case):
    """The query-block backends (blocked, sdpa) with 16-row blocks (1024 by default, more than these inputs): a
    batch whose first blocks are padding in every row, and a cached forward in pieces, give each sequence's logits
    alone."""
    monkeypatch.setattr(extension_blocks, "BLOCK", 16)
    model = patched_tiny(case)
    rows = [tokens(length, seed=20 + length) for length in (80, 71, 60)]
    batch = torch.cat([torch.cat([torch.zeros(1, 100 - row.shape[1], dtype=torch.long), row], 1) for row in rows])
    mask = (batch != 0).long()  # tokens are drawn from 1 .. 96: 0 is padding only
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        together = model(batch, attention_mask=mask, position_ids=position_ids).logits
    monkeypatch.setattr(extension_blocks, "BLOCK", 1024)
    for index, alone in enumerate(rows):
        with torch.no_grad():
            expected = model(alone).logits[0]
        torch.testing.assert_close(together[index, mask[index].bool()], expected, **TOLERANCE)
    monkeypatch.setattr(extension_blocks, "BLOCK", 16)
    ids = tokens(100, seed=14)
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
    torch.testing.assert_close(_fed_in_pieces(model, ids, DynamicCache(config=model.config)), full, **TOLERANCE)
