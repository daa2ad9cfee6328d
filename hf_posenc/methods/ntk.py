"""NTK-aware base change (bloc97 2023) and its dynamic form (emozilla 2023)."""

from __future__ import annotations

import math

import torch

from ..registry import Method, register
from ._common import ScaledRopeParams, rope_base, rope_inv_freq


def ntk_base(base: float, factor: float, head_dim: int) -> float:
    """The NTK-aware base (bloc97, 2023), YaRN (Peng et al., 2023, arXiv 2309.00071), eq. 16:
    ``b' = b * s^(d / (d - 2))``.

    Args:
        base (`float`): the RoPE base ``b`` (``rope_theta``), a finite number > 1.
        factor (`float`): the scale ``s``.
        head_dim (`int`): the rotary dimension ``d``, > 2.

    Raises:
        ValueError: ``head_dim <= 2``, ``base`` not finite or not > 1, or ``b'`` not a finite float.
        TypeError: ``base`` is not a number.
    """
    if head_dim <= 2:
        raise ValueError(f"NTK-aware scaling needs a rotary dimension d > 2 (its exponent is d/(d-2)), got {head_dim}.")
    try:
        scaled = rope_base(base) * factor ** (head_dim / (head_dim - 2))
    except OverflowError:
        scaled = math.inf
    if not math.isfinite(scaled):
        raise ValueError(
            f"The NTK-aware base b * s^(d/(d-2)) overflows for base={base!r}, scale s={factor!r} and d={head_dim}; "
            "use a smaller factor or base."
        )
    return scaled


def ntk_frequencies(
    params: ScaledRopeParams,
    *,
    head_dim: int,
    base: float,
    seq_len: int | None = None,
    dtype=torch.float64,
    device=None,
) -> tuple[torch.Tensor, float]:
    """Static NTK-aware scaling (bloc97, 2023), YaRN (Peng et al., 2023, arXiv 2309.00071), eqs. 15-16: RoPE with
    the base ``b' = b * s^(d / (d - 2))`` (:func:`ntk_base`), ``theta_i' = b'^(-2i/d)``; the highest frequency is
    kept, the lowest divided by ``s``.

    Args:
        params (`ScaledRopeParams`): ``factor``, ``s = L'/L``.
        head_dim (`int`): the rotary dimension ``d``.
        base (`float`): the RoPE base ``b`` (``rope_theta``).
        seq_len (`int`, *optional*): not read (static); part of the methods' ``frequencies`` signature.
        dtype (`torch.dtype`, defaults to float64): dtype of the returned ``inv_freq``.
        device (`torch.device` or `str`, *optional*): where ``inv_freq`` is made.

    Returns:
        `tuple[torch.Tensor, float]`: ``theta_i'`` (``d // 2`` values) and the attention factor, 1.

    Raises:
        ValueError: as :func:`ntk_base` and :func:`~hf_posenc.methods._common.rope_inv_freq` refuse their inputs.
    """
    return rope_inv_freq(head_dim, ntk_base(base, params.factor, head_dim), dtype=dtype, device=device), 1.0


def ntk_transformers_rope(params: ScaledRopeParams, head_dim: int, base: float) -> dict:
    return {"rope_type": "default", "rope_theta": ntk_base(base, params.factor, head_dim)}


def dynamic_ntk_frequencies(
    params: ScaledRopeParams,
    *,
    head_dim: int,
    base: float,
    seq_len: int | None = None,
    dtype=torch.float64,
    device=None,
) -> tuple[torch.Tensor, float]:
    """Dynamic NTK (emozilla, 2023; YaRN, Peng et al., 2023, arXiv 2309.00071, §3.3) for the current length ``l``,
    as transformers' ``dynamic`` rope type computes it: ``b' = b * ((s * l / L) - (s - 1))^(d / (d - 2))`` when
    ``l > L``, the unscaled base otherwise.

    Args:
        params (`ScaledRopeParams`): ``factor`` ``s`` and the trained context ``L``.
        head_dim (`int`): the rotary dimension ``d``.
        base (`float`): the RoPE base ``b`` (``rope_theta``).
        seq_len (`int`, *optional*): the current length ``l``; None counts as ``L``.
        dtype (`torch.dtype`, defaults to float64): dtype of the returned ``inv_freq``.
        device (`torch.device` or `str`, *optional*): where ``inv_freq`` is made.

    Returns:
        `tuple[torch.Tensor, float]`: ``theta_i'`` (``d // 2`` values) and the attention factor, 1.

    Raises:
        ValueError: as :func:`ntk_base` and :func:`~hf_posenc.methods._common.rope_inv_freq` refuse their inputs.
    """
    length = max(seq_len or 0, params.context)
    scale = params.factor * length / params.context - (params.factor - 1)
    return rope_inv_freq(head_dim, ntk_base(base, scale, head_dim), dtype=dtype, device=device), 1.0


def dynamic_ntk_transformers_rope(params: ScaledRopeParams, head_dim: int, base: float) -> dict:
    # transformers' "dynamic" takes L from config.max_position_embeddings; the patch sets it to L.
    return {"rope_type": "dynamic", "factor": params.factor}


register(
    Method(
        name="ntk",
        aliases=("ntk-aware",),
        params=ScaledRopeParams,
        frequencies=ntk_frequencies,
        transformers_rope=ntk_transformers_rope,
        depends_on_length=False,
        paper="bloc97 2023, NTK-Aware Scaled RoPE (reddit r/LocalLLaMA); YaRN paper §3.1",
        summary="Training-free, good for small s (2-4); a larger base resolves short distances less well.",
    )
)
register(
    Method(
        name="dynamic-ntk",
        aliases=("dynamic", "ntk-dynamic"),
        params=ScaledRopeParams,
        frequencies=dynamic_ntk_frequencies,
        transformers_rope=dynamic_ntk_transformers_rope,
        dynamic=True,
        unchanged_within_context=True,
        depends_on_length=True,
        paper="emozilla 2023, Dynamically Scaled RoPE (reddit r/LocalLLaMA); YaRN paper §3.3",
        summary="Training-free; the unpatched model up to L, NTK scaling that grows with the length past it.",
    )
)
