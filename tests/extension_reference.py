"""A float64 reference forward pass of the tiny Llama-family decoders under Self-Extend, DCA, STRING, ReRoPE,
Leaky ReRoPE and log-n.

Written from the papers' definitions, independent of hf_posenc's attention code on purpose: the tests compare the
two. The causal (query i, key j) pairs split into segments (:func:`segments`), each with a query position that is a
function of i and a key position that is a function of j; per segment the queries and keys are rotated at those
positions directly (HF's half-split RoPE, ``rotate_half``; never by re-rotating the model's q and k), and one
causal softmax runs over the merged logits. Only sequences without padding (token positions 0 .. T-1).

- Self-Extend (Jin et al. 2024, arXiv 2401.01325), group size G, neighbour window W: if i - j < W the pair uses the
  true positions i and j; otherwise the query sits at floor(i/G) + W - W/G and the key at floor(j/G).
- DCA (An et al. 2024, arXiv 2402.17463), s = chunk_size - local_size: the key sits at j mod s; the query at i mod s
  in the same chunk (floor(i/s) == floor(j/s)), min(i mod s + s, chunk_size) in the chunk before, and
  min(2s - 1, chunk_size) in any earlier chunk.
- STRING (An et al. 2025, arXiv 2410.18745), shifted offset S, local value W: if i - j < S the true positions;
  otherwise the query at i - S + W and the key at j. The authors' code multiplies q and k by attention_factor.
- ReRoPE (Su 2023, kexue.fm/archives/9708), window w: if i - j < w the true positions; otherwise the query at w and
  the key at 0. Leaky ReRoPE: otherwise the query at (i + w (k - 1)) / k and the key at j / k.
- log-n (Qwen): the query at position p multiplied by max(1, ln(p + 1) / ln L); Llama 4's variant by
  1 + attn_scale * ln(floor((p + 1) / floor_scale) + 1).
- yarn: YaRN's frequencies and attention factor (paper_formulas.yarn) on both q and k.

``method`` is "none" or a combination of at most one of each ("yarn+logn", "self-extend+logn", "yarn+dca+logn"):
the remap places the pairs, log-n scales each query by the factor of its true position, YaRN sets the frequencies.
"""

from __future__ import annotations

import math

import paper_formulas as paper
import torch

F64 = torch.float64


def segments(method: str, length: int, **params) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The pairs (query i, key j <= i) split by the rule that places them: (query position (T, 1), key position
    (1, T), pairs (T, T) bool) per segment, float64 positions; the segments' pairs partition the causal triangle.
    Self-Extend takes group_size and window, DCA chunk_size and local_size; any other method keeps the true
    positions (one segment)."""
    i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    causal = j <= i
    parts = method.split("+")
    if "self-extend" in parts:
        g, w = params["group_size"], params["window"]
        assert w % g == 0, "the window is a multiple of the group size"
        neighbour = causal & (i - j < w)
        found = [(i, j, neighbour), (i // g + w - w // g, j // g, causal & ~neighbour)]
    elif "string" in parts:
        shift, local = params["shifted_offset"], params["local_value"]
        near = causal & (i - j < shift)
        found = [(i, j, near), (i - shift + local, j, causal & ~near)]
    elif "rerope" in parts:
        w = params["window"]
        near = causal & (i - j < w)
        found = [(i, j, near), (torch.full_like(i, w), torch.zeros_like(j), causal & ~near)]
    elif "leaky-rerope" in parts:
        w, k = params["window"], params["k"]
        near = causal & (i - j < w)
        found = [(i, j, near), ((i.to(F64) + w * (k - 1)) / k, j.to(F64) / k, causal & ~near)]
    elif "dca" in parts:
        c, local = params["chunk_size"], params["local_size"]
        s = c - local
        apart = i // s - j // s  # how many chunks the key lies before the query
        found = [
            (i % s, j % s, causal & (apart == 0)),
            (torch.clamp(i % s + s, max=c), j % s, causal & (apart == 1)),
            (torch.full_like(i, min(2 * s - 1, c)), j % s, causal & (apart >= 2)),
        ]
    else:
        found = [(i, j, causal)]
    return [(query.to(F64), key.to(F64), pairs) for query, key, pairs in found]


def pair_positions(method: str, length: int, **params) -> tuple[torch.Tensor, torch.Tensor]:
    """(query position, key position), each (T, T) float64: entry [i, j] is where the pair's query i and key j are
    rotated (zero above the diagonal)."""
    query, key = torch.zeros(length, length, dtype=F64), torch.zeros(length, length, dtype=F64)
    for q, k, pairs in segments(method, length, **params):
        query = torch.where(pairs, q, query)
        key = torch.where(pairs, k, key)
    return query, key


def query_scale(method: str, length: int, L: int, variant: str = "qwen", attn_scale=None, floor_scale=None):
    """The log-n factor of each query position, (T,) float64; ones for methods without log-n."""
    p = torch.arange(length, dtype=F64)
    if "logn" not in method.split("+"):
        return torch.ones(length, dtype=F64)
    if variant == "qwen":
        return torch.tensor([max(1.0, math.log(q + 1) / math.log(L)) for q in range(length)], dtype=F64)
    attn_scale = 0.1 if attn_scale is None else attn_scale
    floor_scale = 8192 if floor_scale is None else floor_scale
    return 1 + attn_scale * torch.log(torch.floor((p + 1) / floor_scale) + 1)


def frequencies(method: str, d: int, base: float, L: int, **yarn) -> tuple[torch.Tensor, float]:
    """(inv_freq (d/2,) float64, factor multiplying both q and k): RoFormer's base^(-2i/d), or YaRN's if the
    method has "yarn"."""
    if "yarn" in method.split("+"):
        inv_freq, factor = paper.yarn(d, base, L, yarn.pop("factor"), **yarn)
    else:
        inv_freq, factor = paper.theta(d, base), 1.0
    return torch.tensor(inv_freq, dtype=F64), factor


def rotate(x: torch.Tensor, position: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """HF's half-split RoPE of x (..., D) at ``position`` (broadcast against x's leading dims), angles in float64."""
    angles = position[..., None] * inv_freq  # (..., D/2)
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    half = x.shape[-1] // 2
    rotated_half = torch.cat((-x[..., half:], x[..., :half]), -1)
    return x * cos + rotated_half * sin


def _weight(module) -> torch.Tensor:
    return module.weight.detach().to(F64)


def _linear(x: torch.Tensor, module) -> torch.Tensor:
    out = x @ _weight(module).T
    return out if module.bias is None else out + module.bias.detach().to(F64)


def _rms(x: torch.Tensor, norm) -> torch.Tensor:
    return _weight(norm) * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)


_SPLIT = {
    "self-extend": ("group_size", "window"),
    "dca": ("chunk_size", "local_size"),
    "string": ("shifted_offset", "local_value", "attention_factor"),
    "rerope": ("window",),
    "leaky-rerope": ("window", "k"),
    "logn": ("variant", "attn_scale", "floor_scale"),
    "yarn": ("factor", "beta_fast", "beta_slow", "ramp", "truncate"),
}


REMAPS = ("self-extend", "dca", "string", "rerope", "leaky-rerope")


def _split(method: str, params: dict) -> tuple[dict, dict, dict]:
    """The params of the remap, of log-n and of yarn; an unknown name raises (a typo must not pass silently)."""
    parts = [] if method == "none" else method.split("+")
    assert set(parts) <= set(_SPLIT) and len(set(parts)) == len(parts), method
    assert len(set(parts) & set(REMAPS)) <= 1, "one remap at most"
    known = {name for part in parts for name in _SPLIT[part]} | {"original_max_position_embeddings"}
    assert set(params) <= known, set(params) - known
    pick = {part: {k: v for k, v in params.items() if k in _SPLIT[part] and part in parts} for part in _SPLIT}
    return {key: value for part in REMAPS for key, value in pick[part].items()}, pick["logn"], pick["yarn"]


@torch.no_grad()
def reference_logits(model, input_ids: torch.Tensor, method: str = "none", **params) -> torch.Tensor:
    """The logits (B, T, V) float64 of ``model`` (an unpatched Llama, Mistral, Qwen2 or Qwen3 causal LM, its weights
    read in float64) on ``input_ids`` (B, T) without padding, attention changed as ``method`` with ``params``
    (hf_posenc's names; L = original_max_position_embeddings, else config.max_position_embeddings)."""
    config = model.config
    L = params.get("original_max_position_embeddings", config.max_position_embeddings)
    remap, logn, yarn = _split(method, params)
    # STRING's authors multiply RoPE's cos and sin, so q and k, by their attention factor (string_for_llama.py)
    string_factor = remap.pop("attention_factor", 0.1 * math.log(2) + 1) if "string" in method.split("+") else 1.0
    batch, length = input_ids.shape
    layers = model.model.layers
    attention = layers[0].self_attn
    assert config.hidden_act == "silu", config.hidden_act
    heads, kv_heads, d = config.num_attention_heads, config.num_key_value_heads, attention.head_dim
    inv_freq, rope_factor = frequencies(method, d, config.rope_parameters["rope_theta"], L, **yarn)
    rope_factor *= string_factor
    parts = segments(method, length, **remap)
    scale = query_scale(method, length, L, **logn)[:, None]  # (T, 1): query i's factor

    x = _weight(model.model.embed_tokens)[input_ids]  # (B, T, hidden)
    for layer in layers:
        a = layer.self_attn
        h = _rms(x, layer.input_layernorm)
        q = _linear(h, a.q_proj).view(batch, length, heads, d)
        k = _linear(h, a.k_proj).view(batch, length, kv_heads, d)
        v = _linear(h, a.v_proj).view(batch, length, kv_heads, d)
        if hasattr(a, "q_norm"):  # Qwen3: RMSNorm over each head, before RoPE
            q, k = _rms(q, a.q_norm), _rms(k, a.k_norm)
        group = heads // kv_heads  # query head n reads kv head n // group
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        q = q.permute(0, 2, 1, 3) * rope_factor  # (B, H, T, D)
        k = k.permute(0, 2, 1, 3) * rope_factor
        logits = torch.full((batch, heads, length, length), -math.inf, dtype=F64)  # -inf: the masked pairs
        for query, key, pairs in parts:  # each segment's q and k rotated at its positions, logits merged
            here = rotate(q * scale, query[:, 0], inv_freq) @ rotate(k, key[0], inv_freq).transpose(-1, -2)
            logits = torch.where(pairs, here / math.sqrt(d), logits)
        weights = torch.softmax(logits, dim=-1)  # one softmax over all of a query's keys
        out = torch.einsum("bhij,bjhd->bihd", weights, v).reshape(batch, length, heads * d)
        x = x + _linear(out, a.o_proj)
        h = _rms(x, layer.post_attention_layernorm)
        mlp = layer.mlp
        x = x + _linear(torch.nn.functional.silu(_linear(h, mlp.gate_proj)) * _linear(h, mlp.up_proj), mlp.down_proj)
    return _linear(_rms(x, model.model.norm), model.lm_head)
