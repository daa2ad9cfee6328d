"""ALiBi against a peer: transformers' own ALiBi model, BLOOM (``build_alibi_tensor``).

BLOOM adds ``m_h * j`` (``j`` the key's position among the row's real tokens) to every logit; the paper's
``-m_h * (i - j)`` differs from it by ``-m_h * i``, a constant per query row that softmax ignores. So the
attention weights and outputs of hf_posenc's backends must equal attention computed with BLOOM's bias,
padding included: an independent implementation of the slopes and of the positions.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers.models.bloom.modeling_bloom import build_alibi_tensor

from hf_posenc.attention.functions import alibi_eager_attention, alibi_flex_attention, alibi_sdpa_attention
from hf_posenc.attention.masks import alibi_distance_mask, alibi_flex_mask
from hf_posenc.methods import alibi_slopes

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

BACKENDS = {
    "eager": (alibi_eager_attention, alibi_distance_mask),
    "sdpa": (alibi_sdpa_attention, alibi_distance_mask),
    "flex": (alibi_flex_attention, alibi_flex_mask),  # uncompiled on CPU
}


@pytest.mark.parametrize("heads", range(1, 65))
def test_slopes_equal_blooms(heads):
    """BLOOM's bias at key position 1 is its slope for each head (float32 in transformers)."""
    bloom = build_alibi_tensor(torch.ones(1, 2), heads, torch.float32)[:, 0, 1]  # (H,)
    torch.testing.assert_close(alibi_slopes(heads, dtype=torch.float32), bloom, rtol=1e-6, atol=0)


def bloom_attention(query, key, value, attention_mask, scale):
    """Causal attention with BLOOM's ALiBi: ``(B, H, T, D)`` inputs and a 2D mask -> ``(B, T, H, D)``."""
    batch, heads, length, _ = query.shape
    groups = heads // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    bias = build_alibi_tensor(attention_mask, heads, torch.float32).view(batch, heads, 1, length)
    allowed = torch.ones(length, length, dtype=torch.bool).tril() & attention_mask.bool()[:, None, None, :]
    scores = (query @ key.transpose(2, 3)) * scale + bias  # (B, H, T, T)
    weights = scores.masked_fill(~allowed, -torch.inf).softmax(-1)
    return (weights @ value).transpose(1, 2)  # (B, T, H, D)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("heads, kv_heads", [(6, 6), (6, 3), (8, 2), (12, 4)])
def test_attention_equals_blooms_with_left_padding(backend, heads, kv_heads):
    generator = torch.Generator().manual_seed(heads * 10 + kv_heads)
    batch, length, dim = 3, 17, 16
    query = torch.randn(batch, heads, length, dim, generator=generator)
    key, value = (torch.randn(batch, kv_heads, length, dim, generator=generator) for _ in range(2))
    attention_mask = torch.ones(batch, length, dtype=torch.long)
    attention_mask[1, :5] = 0  # left padding
    attention_mask[2, :11] = 0
    attention, mask_function = BACKENDS[backend]
    padding = attention_mask.bool()  # what transformers hands mask functions
    mask = mask_function(batch_size=batch, q_length=length, kv_length=length, attention_mask=padding)
    module = SimpleNamespace(alibi_slopes=alibi_slopes(heads, dtype=torch.float32), training=False)
    ours = attention(module, query, key, value, mask, scaling=dim**-0.5)[0]  # (B, T, H, D)
    expected = bloom_attention(query, key, value, attention_mask, dim**-0.5)
    torch.testing.assert_close(ours[padding], expected[padding], rtol=1e-5, atol=1e-5)  # padding queries: unused
