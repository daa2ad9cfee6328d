"""Pure math of the position-encoding methods, one family a module; importing registers them."""

from __future__ import annotations

from typing import Any

import torch

from ..registry import get_method
from . import llama3, longrope, ntk, pi, yarn  # noqa: F401  (registration)


def rope_frequencies(
    method: str,
    *,
    head_dim: int,
    base: float,
    original_max_position_embeddings: int,
    seq_len: int | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    **params: Any,
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and attention factor of a RoPE ``method``; the math ``patch`` applies.

    Args:
        method (`str`): a name from :func:`hf_posenc.available_methods` (or an alias).
        head_dim (`int`): the rotary dimension ``d`` (``head_dim * partial_rotary_factor``).
        base (`float`): the RoPE base ``b`` (``rope_theta``).
        original_max_position_embeddings (`int`): the trained context ``L``.
        seq_len (`int`, *optional*): the current length ``l``, for dynamic methods.
        dtype (`torch.dtype`, defaults to float64): dtype of the returned ``inv_freq``.
        **params: the method's parameters (``factor``, ``beta_fast``, ...).

    Returns:
        `tuple[torch.Tensor, float]`: ``inv_freq`` (``d // 2`` values, ``theta_i'``) and the factor that
        multiplies cos and sin.
    """
    spec = get_method(method)
    if "rope" not in spec.applies_to:
        raise ValueError(f"Method {spec.name!r} is not a RoPE method.")
    resolved = spec.make_params(original_max_position_embeddings=original_max_position_embeddings, **params)
    return spec.frequencies(resolved, head_dim=head_dim, base=base, seq_len=seq_len, dtype=dtype, device=device)
