"""Shared pieces of the RoPE methods: parameter checks and the unscaled RoPE frequencies."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import torch


def real_number(name: str, value: Any) -> float:
    """``value`` as a finite float, or ``ValueError``/``TypeError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy scalars too
        raise TypeError(f"{name} must be a number, got {type(value).__name__}: {value!r}.")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}.")
    return float(value)


def scale_factor(value: Any, name: str = "factor") -> float:
    """A context-extension factor ``s = L'/L``: a finite number >= 1."""
    value = real_number(name, value)
    if value < 1.0:
        raise ValueError(
            f"{name} must be >= 1 (s = L'/L extends the trained context L to L'; s < 1 would shrink it), got {value!r}."
        )
    return value


def positive_number(name: str, value: Any) -> float:
    value = real_number(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}.")
    return value


def positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    return int(value)


@dataclass(frozen=True, kw_only=True)
class RopeParams:
    """Parameters every RoPE method has.

    Args:
        original_max_position_embeddings (`int`, *optional*): the trained context ``L``. ``patch``
            fills it from the model's config when omitted.
    """

    original_max_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        if self.original_max_position_embeddings is not None:
            context = positive_int("original_max_position_embeddings", self.original_max_position_embeddings)
            self._set("original_max_position_embeddings", context)

    @property
    def context(self) -> int:
        """``L``; raises if it was never resolved."""
        if self.original_max_position_embeddings is None:
            raise ValueError("original_max_position_embeddings (the trained context L) is required here.")
        return self.original_max_position_embeddings

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)


@dataclass(frozen=True, kw_only=True)
class ScaledRopeParams(RopeParams):
    """Args:
    factor (`float`): ``s = L'/L`` >= 1.
    """

    factor: float

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("factor", scale_factor(self.factor))


def rope_inv_freq(
    head_dim: int, base: float, *, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
) -> torch.Tensor:
    """RoFormer (Su et al. 2021) Eq. (15): ``theta_i = base^(-2i/d)`` for pairs ``i = 0 .. d/2 - 1``."""
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"The rotary dimension must be even and >= 2, got {head_dim}.")
    exponent = torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim
    return (float(base) ** -exponent).to(dtype)


def wavelengths(inv_freq: torch.Tensor) -> torch.Tensor:
    """``lambda_i = 2*pi / theta_i`` (YaRN paper §3.2, Eq. for the wavelength)."""
    return 2 * math.pi / inv_freq
