"""Sinusoidal absolute positions (Vaswani et al. 2017, "Attention Is All You Need", arXiv 1706.03762, §3.5):
``PE(p, 2i) = sin(p / 10000^(2i/d))``, ``PE(p, 2i+1) = cos(p / 10000^(2i/d))``, added to the token embeddings.

A fixed function of the position, so it has no length limit. It replaces a learned table (GPT-2's ``wpe``);
a RoPE decoder has no absolute table to replace (adding one on top of its rotation is a new encoding
that no RoPE model was trained with), so hf_posenc refuses it there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..fields import documented, setting
from ..registry import Method, register
from ._common import positive_int, positive_number, real_number

SINUSOID_BASE = 10000.0
SINUSOID_RMS = math.sqrt(0.5)  # each (sin, cos) pair has mean square 1/2, so the table's RMS is 1/sqrt(2)


def sinusoidal_embedding(
    positions: torch.Tensor, dim: int, *, base: float = SINUSOID_BASE, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """The sinusoidal encoding of Vaswani et al. (2017, arXiv 1706.03762), §3.5, at arbitrary positions:
    ``(..., dim)`` for ``positions (...)``.

    Even columns ``2i`` hold ``sin(p * w_i)``, odd columns ``2i + 1`` hold ``cos(p * w_i)``, with
    ``w_i = base^(-2i/dim)``. Computed in float64 (exact integer positions up to 2^53), then cast.

    Args:
        positions (`torch.Tensor`): the positions ``p``, any shape; the result is made on their device.
        dim (`int`): the width ``d``, even.
        base (`float`, defaults to 10000): the paper's wavelength base, > 0.
        dtype (`torch.dtype`, defaults to float64): dtype of the result.

    Raises:
        ValueError: ``dim`` is not a positive even integer, or ``base`` is not finite or not > 0.
        TypeError: ``base`` is not a number.
    """
    dim = positive_int("dim", dim)
    if dim % 2:
        raise ValueError(f"The sinusoidal table interleaves sin and cos, so dim must be even, got {dim}.")
    base = positive_number("base", base)
    frequencies = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device) / dim)  # (d/2,)
    angles = positions.to(torch.float64)[..., None] * frequencies  # (..., d/2)
    table = torch.stack([angles.sin(), angles.cos()], dim=-1)  # (..., d/2, 2): sin to even, cos to odd columns
    return table.flatten(-2).to(dtype)


def sinusoidal_table(
    num_positions: int, dim: int, *, base: float = SINUSOID_BASE, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """The ``(num_positions, dim)`` table of positions ``0 .. num_positions - 1`` (:func:`sinusoidal_embedding`).

    Args:
        num_positions (`int`): rows ``n``.
        dim (`int`): model width ``d`` (even).
        base (`float`, defaults to 10000): the paper's wavelength base.
        dtype (`torch.dtype`, defaults to float64): dtype of the result.
    """
    positions = torch.arange(positive_int("num_positions", num_positions), dtype=torch.float64)
    return sinusoidal_embedding(positions, dim, base=base, dtype=dtype)


@documented
@dataclass(frozen=True, kw_only=True)
class SinusoidalParams:
    """The sinusoidal table of Vaswani et al. 2017, in place of GPT-2's learned one."""

    scale: float | None = setting(
        None,
        help="multiplies the table before it is added. ``patch`` fills in the scale that gives the table the "
        "root-mean-square of the learned table it replaces (``rms(wpe) * sqrt(2)``), so the embeddings keep the "
        "magnitude the model was trained with; the paper uses 1 with token embeddings scaled by ``sqrt(d)``, "
        "which GPT-2's are not.",
    )
    base: float = setting(SINUSOID_BASE, help="the wavelength base, above 1.")

    def __post_init__(self) -> None:
        if self.scale is not None:
            object.__setattr__(self, "scale", positive_number("scale", self.scale))
        base = real_number("base", self.base)
        if base <= 1.0:
            raise ValueError(
                f"base must be > 1 so that the wavelengths base^(2i/d) grow across the table (1 gives every pair "
                f"the same one), got {base!r}."
            )
        object.__setattr__(self, "base", base)


register(
    Method(
        name="sinusoidal",
        params=SinusoidalParams,
        applies_to=frozenset({"learned"}),
        role="replace",
        depends_on_length=False,
        paper="Vaswani et al. 2017, Attention Is All You Need (arXiv 1706.03762), §3.5",
        summary="Replaces a learned position table (GPT-2's wpe) by the fixed sinusoidal one, any length; "
        "needs fine-tuning.",
    )
)
