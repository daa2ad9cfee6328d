"""Position Interpolation (Chen et al. 2023, arXiv 2306.15595): positions squeezed by ``s``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..registry import Method, register
from ._common import RopeParams, rope_inv_freq, scale_factor


@dataclass(frozen=True, kw_only=True)
class PIParams(RopeParams):
    """Args:
    factor (`float`): ``s = L'/L`` >= 1.
    """

    factor: float

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("factor", scale_factor(self.factor))


def pi_frequencies(
    params: PIParams, *, head_dim: int, base: float, seq_len: int | None = None, dtype=torch.float64, device=None
) -> tuple[torch.Tensor, float]:
    """PI, paper §2.2: ``f'(x, m) = f(x, m L / L')``, i.e. ``theta_i' = theta_i / s``."""
    return rope_inv_freq(head_dim, base, dtype=dtype, device=device) / params.factor, 1.0


def pi_native(params: PIParams, head_dim: int, base: float) -> dict:
    return {"rope_type": "linear", "factor": params.factor}


register(
    Method(
        name="pi",
        aliases=("linear", "position-interpolation"),
        params=PIParams,
        frequencies=pi_frequencies,
        native=pi_native,
        paper="Chen et al. 2023, Extending Context Window of LLMs via Position Interpolation (arXiv 2306.15595)",
        summary="Needs a short fine-tune (1000 steps in the paper); without one it hurts at every length.",
    )
)
