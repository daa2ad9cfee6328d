"""Pure math of the position-encoding methods, one family a module; importing registers them."""

from __future__ import annotations

import numbers
from typing import Any

import torch

from ..registry import Method, get_method, params_to_dict
from . import (  # noqa: F401  (registration)
    alibi,
    dca,
    llama3,
    longrope,
    nope,
    ntk,
    pi,
    rerope,
    self_extend,
    sinusoidal,
    string_rope,
    t5_bias,
    temperature,
    yarn,
)
from ._common import frequency_problem
from .alibi import alibi_slopes  # noqa: F401  (public: hf_posenc.alibi_slopes)
from .sinusoidal import sinusoidal_table  # noqa: F401  (public)
from .t5_bias import t5_buckets  # noqa: F401  (public)


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
        device (`torch.device` or `str`, *optional*): where ``inv_freq`` is made.
        **params: the method's parameters (``factor``, ``beta_fast``, ...).

    Returns:
        `tuple[torch.Tensor, float]`: ``inv_freq`` (``d // 2`` values, ``theta_i'``) and the factor that
        multiplies cos and sin.
    """
    spec = get_method(method)
    if spec.frequencies is None:
        raise ValueError(f"Method {spec.name!r} is not a RoPE method.")
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, numbers.Integral) or seq_len < 1):
        raise ValueError(f"seq_len (the current length l) must be a positive integer or None, got {seq_len!r}.")
    resolved = spec.make_params(original_max_position_embeddings=original_max_position_embeddings, **params)
    return compute_frequencies(
        spec, resolved, head_dim=head_dim, base=base, seq_len=seq_len, dtype=dtype, device=device
    )


def compute_frequencies(
    method: Method,
    params: Any,
    *,
    head_dim: int,
    base: float,
    seq_len: int | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, float]:
    """``method.frequencies`` on built ``params``, checked: values each in their own range may together still give a
    frequency that is not finite and > 0 in float32 (a huge base, extreme long factors) or an unusable attention
    factor (:func:`~hf_posenc.methods._common.frequency_problem`).

    Args:
        method (`Method`): a registered RoPE method (one with ``frequencies``).
        params (`Any`): its parameters, built (``method.make_params``) with the trained context ``L`` resolved.
        head_dim (`int`): the rotary dimension ``d``.
        base (`float`): the RoPE base ``b`` (``rope_theta``).
        seq_len (`int`, *optional*): the current length ``l``, for dynamic methods.
        dtype (`torch.dtype`, defaults to float64): dtype of the returned ``inv_freq``.
        device (`torch.device` or `str`, *optional*): where ``inv_freq`` is made.

    Returns:
        `tuple[torch.Tensor, float]`: ``inv_freq`` (``d // 2`` values, ``theta_i'``) and the factor that multiplies
        cos and sin, as :func:`rope_frequencies` returns them.

    Raises:
        ValueError: the result is unusable (the message names the method and every input), or the method's own
            math refuses the inputs.
    """
    inv_freq, attention = method.frequencies(
        params, head_dim=head_dim, base=base, seq_len=seq_len, dtype=dtype, device=device
    )
    problem = frequency_problem(inv_freq, attention)
    if problem is not None:
        raise ValueError(f"{_described(method, params, base, seq_len)} {problem}")
    return inv_freq, attention


def _described(method: Method, params: Any, base: float, seq_len: int | None) -> str:
    """``method 'pi' with base=10000.0, factor=1e+30, ...``; lists as their range and length."""
    values = {"base": base, **params_to_dict(params), "seq_len": seq_len}
    shown = [
        f"{key}=[{min(value):g}..{max(value):g}] ({len(value)} values)"
        if isinstance(value, list)
        else f"{key}={value!r}"
        for key, value in values.items()
        if value is not None and value != []
    ]
    return f"method {method.name!r} with {', '.join(shown)}"
