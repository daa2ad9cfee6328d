"""Negative log-likelihood of windows, computed in chunks from the hidden states.

The base model (``model.get_decoder()``) runs once over the window; the output head is applied to
``chunk_size`` positions at a time and only where a token is scored, so the full-vocabulary logits of
a long window never exist at once (at 128k tokens and 32k vocabulary they would be 16 GiB in float32).
Log-probabilities are taken in float32 (float64 for a float64 model) and summed in float64.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from ..architectures import rotary_modules

DEFAULT_CHUNK_SIZE = 2048


def _hidden_states(model, input_ids: torch.Tensor, score_from: int) -> torch.Tensor:
    """The decoder's hidden states ``(B, T, H)`` of ``input_ids``, checking ``1 <= score_from < T``; the model's
    rotary state as built (:func:`as_if_alone`)."""
    if not 1 <= score_from < input_ids.shape[1]:
        raise ValueError(f"score_from={score_from} must be in [1, {input_ids.shape[1]}).")
    as_if_alone(model)
    return model.get_decoder()(input_ids=input_ids, use_cache=False)[0]


def as_if_alone(model) -> None:
    """Put back the frequencies of transformers' ``dynamic`` rope types as built. transformers keeps those of the
    longest input it has seen until an input shorter than ``L`` comes (made for generation with a cache), so a
    window's loss would depend on the windows and methods scored before it, and on how they were split between
    processes. Its own reset, done here before each forward: ``inv_freq`` and ``max_seq_len_cached``. hf_posenc's
    dynamic methods need none (their frequencies come from each call's length alone)."""
    _reset(_dynamic_rotary(model))


@contextlib.contextmanager
def each_call_alone(model) -> Iterator[None]:
    """Within the block, each call of ``model`` starts from its rotary state as built (:func:`as_if_alone`): for
    lm-eval, whose requests (longest first) run through the model's own forward. Within one ``generate()`` this
    changes nothing: its lengths only grow."""
    handle = model.register_forward_pre_hook(functools.partial(_reset, _dynamic_rotary(model)))
    try:
        yield
    finally:
        handle.remove()


def _dynamic_rotary(model) -> list[torch.nn.Module]:
    """The rotary modules transformers' dynamic update changes (hf_posenc's own dynamic patches report another
    ``rope_type``, which it skips)."""
    return [m for _, m in rotary_modules(model) if isinstance(m.rope_type, str) and "dynamic" in m.rope_type]


def _reset(modules: list[torch.nn.Module], *hook_args) -> None:
    """transformers' own reset of the dynamic update, on each of ``modules`` whose state moved (a forward pre-hook
    with ``modules`` bound)."""
    for module in modules:
        if getattr(module, "max_seq_len_cached", None) != getattr(module, "original_max_seq_len", None):
            module.register_buffer("inv_freq", module.original_inv_freq.to(module.inv_freq.device), persistent=False)
            module.max_seq_len_cached = module.original_max_seq_len


def _logit_chunks(model, hidden: torch.Tensor, chunk_size: int) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(begin, logits (B, C, V))`` of the output head on ``hidden[:, begin : begin + C]``.

    Args:
        model: a causal LM whose logits are ``get_output_embeddings()(get_decoder()(ids)[0])``
            (checked by :func:`check_head_decomposition`).
        hidden (`torch.Tensor` of shape `(B, S, H)`): the hidden states of the positions to score.
        chunk_size (`int`): positions per output-head call.
    """
    head = model.get_output_embeddings()
    for begin in range(0, hidden.shape[1], chunk_size):
        logits = head(hidden[:, begin : begin + chunk_size])  # (B, C, V)
        yield begin, logits.to(torch.promote_types(logits.dtype, torch.float32))


@torch.inference_mode()
def cumulative_nll(
    model, input_ids: torch.Tensor, score_from: int, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> torch.Tensor:
    """Running sums of the NLL (nats, float64) of each window's tokens at positions ``score_from … T-1``.

    Position ``p`` is predicted at ``p - 1``, so ``score_from >= 1``. Entry ``k`` sums the tokens at
    ``score_from … score_from + k``: in a causal model whose output at a position does not depend on the
    input's length, it is the NLL of ``input_ids[:, : score_from + k + 1]`` scored alone.

    Returns:
        `torch.DoubleTensor` of shape `(B, T - score_from)`.
    """
    hidden = _hidden_states(model, input_ids, score_from)[:, score_from - 1 : -1]  # (B, S, H)
    targets = input_ids[:, score_from:]  # (B, S): what those positions predict
    parts = []
    for begin, logits in _logit_chunks(model, hidden, chunk_size):
        chunk = targets[:, begin : begin + logits.shape[1]].to(logits.device)  # (B, C); a split model's last GPU
        # (B*C, V) rows: the class-dim-1 layout (B, V, C) is ~10x less accurate in float32 on CPU
        nll = F.cross_entropy(logits.flatten(0, 1), chunk.flatten(), reduction="none")  # (B*C,)
        parts.append(nll.view(chunk.shape))
    return torch.cat(parts, dim=1).cumsum(dim=1, dtype=torch.float64)  # (B, S)


def window_nll(model, input_ids: torch.Tensor, score_from: int, chunk_size: int = DEFAULT_CHUNK_SIZE) -> torch.Tensor:
    """Summed NLL (nats, float64) of each window's tokens at positions ``score_from … T-1``: a `(B,)` tensor,
    each window scoring ``T - score_from`` tokens (the last of :func:`cumulative_nll`)."""
    return cumulative_nll(model, input_ids, score_from, chunk_size)[:, -1]


@torch.inference_mode()
def greedy_continuation(
    model, input_ids: torch.Tensor, score_from: int, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whether the argmax prediction equals every token at positions ``score_from … T-1``, and the argmax
    after the last one.

    Under teacher forcing this is exactly "greedy decoding from ``input_ids[:, :score_from]`` produces
    these tokens first, then that token", without generating or a KV cache.

    Returns:
        `tuple[torch.BoolTensor, torch.LongTensor]`: both of shape `(B,)`.
    """
    hidden = _hidden_states(model, input_ids, score_from)[:, score_from - 1 :]  # (B, S + 1, H)
    predicted = torch.cat([logits.argmax(dim=-1) for _, logits in _logit_chunks(model, hidden, chunk_size)], dim=1)
    matches = predicted[:, :-1] == input_ids[:, score_from:].to(predicted.device)
    return matches.all(dim=1), predicted[:, -1]


@torch.inference_mode()
def check_head_decomposition(model, input_ids: torch.Tensor, atol: float = 1e-3) -> None:
    """Raise if ``model(ids).logits`` is not the output head applied to the decoder's hidden states.

    Models that scale or soft-cap logits in their ``forward`` would be scored wrongly by the chunked
    loss; this checks a few positions once, before any long window.
    """
    ids = input_ids[:, :16]
    full = model(input_ids=ids, use_cache=False).logits.float()
    parts = model.get_output_embeddings()(model.get_decoder()(input_ids=ids, use_cache=False)[0]).float()
    if full.shape != parts.shape or not torch.allclose(full, parts, atol=atol, rtol=1e-3):
        raise NotImplementedError(
            f"{type(model).__name__} computes logits differently from its output head on the decoder's "
            "hidden states (logit scaling or soft-capping?); the chunked loss does not support it yet."
        )


def perplexity(nll_sum: float, tokens: int) -> tuple[float, float]:
    """Token-weighted mean NLL and its perplexity ``exp(mean)`` from a summed NLL over ``tokens`` (``inf``
    past float range: a diverging model is a result too; a NaN loss, a numerical failure, stays NaN)."""
    if tokens <= 0:
        raise ValueError("No token was scored.")
    mean = nll_sum / tokens
    if math.isnan(mean) or mean < math.log(sys.float_info.max):
        return mean, math.exp(mean)
    return mean, math.inf
