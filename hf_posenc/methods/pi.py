"""Position Interpolation (Chen et al. 2023, arXiv 2306.15595): positions squeezed by ``s``."""

from __future__ import annotations

import torch

from ..registry import Method, register
from ._common import ScaledRopeParams, rope_inv_freq


def pi_frequencies(
    params: ScaledRopeParams,
    *,
    head_dim: int,
    base: float,
    seq_len: int | None = None,
    dtype=torch.float64,
    device=None,
) -> tuple[torch.Tensor, float]:
    """PI, paper §2.2: ``f'(x, m) = f(x, m L / L')``, i.e. ``theta_i' = theta_i / s``."""
    return rope_inv_freq(head_dim, base, dtype=dtype, device=device) / params.factor, 1.0


def pi_native(params: ScaledRopeParams, head_dim: int, base: float) -> dict:
    return {"rope_type": "linear", "factor": params.factor}


register(
    Method(
        name="pi",
        aliases=("linear", "position-interpolation"),
        params=ScaledRopeParams,
        frequencies=pi_frequencies,
        native=pi_native,
        paper="Chen et al. 2023, Extending Context Window of LLMs via Position Interpolation (arXiv 2306.15595)",
        summary="Needs a short fine-tune (1000 steps in the paper); without one it hurts at every length.",
    )
)
