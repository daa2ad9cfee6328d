"""Llama-3.1 style RoPE scaling (Meta 2024, the Llama 3 herd of models): a blend over wavelength."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..fields import documented, setting
from ..registry import Method, register
from ._common import ScaledRopeParams, positive_number, rope_inv_freq, wavelengths


@documented
@dataclass(frozen=True, kw_only=True)
class Llama3Params(ScaledRopeParams):
    """Llama 3.1's RoPE scaling (``factor`` 8 for Llama 3.1): wavelengths between the two bounds blended."""

    low_freq_factor: float = setting(1.0, help="wavelengths above ``L / low_freq_factor`` are divided by s.")
    high_freq_factor: float = setting(4.0, help="wavelengths below ``L / high_freq_factor`` are kept.")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("low_freq_factor", positive_number("low_freq_factor", self.low_freq_factor))
        self._set("high_freq_factor", positive_number("high_freq_factor", self.high_freq_factor))
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"high_freq_factor must be greater than low_freq_factor, got high_freq_factor="
                f"{self.high_freq_factor} and low_freq_factor={self.low_freq_factor}."
            )


def llama3_frequencies(
    params: Llama3Params, *, head_dim: int, base: float, seq_len=None, dtype=torch.float64, device=None
) -> tuple[torch.Tensor, float]:
    """Llama 3.1's RoPE scaling (Meta, 2024, The Llama 3 Herd of Models, arXiv 2407.21783; the formula of its
    reference code, llama-models), by each pair's wavelength ``lambda = 2 pi / theta``: ``lambda < L/high``:
    ``theta``; ``lambda > L/low``: ``theta/s``; between, with ``smooth = (L/lambda - low) / (high - low)``:
    ``(1 - smooth) theta/s + smooth theta``. Computed in float64.

    Args:
        params (`Llama3Params`): ``factor`` ``s``, ``low_freq_factor`` ``low``, ``high_freq_factor`` ``high`` and
            the trained context ``L``.
        head_dim (`int`): the rotary dimension ``d``.
        base (`float`): the RoPE base ``b`` (``rope_theta``).
        seq_len (`int`, *optional*): not read (static); part of the methods' ``frequencies`` signature.
        dtype (`torch.dtype`, defaults to float64): dtype of the returned ``inv_freq``.
        device (`torch.device` or `str`, *optional*): where ``inv_freq`` is made.

    Returns:
        `tuple[torch.Tensor, float]`: ``theta'`` (``d // 2`` values) and the attention factor, 1.

    Raises:
        ValueError: ``head_dim`` or ``base`` out of range (:func:`~hf_posenc.methods._common.rope_inv_freq`).
    """
    theta = rope_inv_freq(head_dim, base, device=device)
    wavelength = wavelengths(theta)
    context, low, high = params.context, params.low_freq_factor, params.high_freq_factor
    smooth = ((context / wavelength - low) / (high - low)).clamp(0, 1)
    blended = (1 - smooth) * theta / params.factor + smooth * theta
    inv_freq = torch.where(wavelength < context / high, theta, blended)
    inv_freq = torch.where(wavelength > context / low, theta / params.factor, inv_freq)
    return inv_freq.to(dtype), 1.0


def llama3_transformers_rope(params: Llama3Params, head_dim: int, base: float) -> dict:
    return {
        "rope_type": "llama3",
        "factor": params.factor,
        "low_freq_factor": params.low_freq_factor,
        "high_freq_factor": params.high_freq_factor,
        "original_max_position_embeddings": params.context,
    }


register(
    Method(
        name="llama3",
        aliases=("llama-3",),
        params=Llama3Params,
        frequencies=llama3_frequencies,
        transformers_rope=llama3_transformers_rope,
        depends_on_length=False,
        paper="Meta 2024, The Llama 3 Herd of Models (arXiv 2407.21783); reference code in llama-models",
        summary="What Llama 3.1 shipped with (s = 8 from 8k to 128k, after long-context training).",
    )
)
