"""Shared pieces of the RoPE methods: parameter checks and the unscaled RoPE frequencies."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import torch

from ..fields import documented, setting

MAX_FACTOR = 2.0**24  # see scale_factor
FLOAT32_MAX = torch.finfo(torch.float32).max


def real_number(name: str, value: Any) -> float:
    """``value`` as a finite float, or ``ValueError``/``TypeError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy scalars too
        raise TypeError(f"{name} must be a number, got {type(value).__name__}: {value!r}.")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}.")
    return float(value)


def scale_factor(value: Any, name: str = "factor") -> float:
    """A context-extension factor ``s = L'/L``: a number in ``[1, MAX_FACTOR]``.

    The bound, 2^24, lies far past any published extension (LongRoPE's 512) and keeps every method's
    arithmetic finite (``round(s * L)``, NTK's ``b * s^(d/(d-2))``, ``theta_i / s`` in float32); it is also
    where float32, in which transformers computes RoPE angles ``m * theta``, stops telling neighbouring
    positions apart.
    """
    value = real_number(name, value)
    if value < 1.0:
        raise ValueError(
            f"{name} must be >= 1 (s = L'/L extends the trained context L to L'; s < 1 would shrink it), got {value!r}."
        )
    if value > MAX_FACTOR:
        raise ValueError(
            f"{name} must be at most 2^24 = {MAX_FACTOR:.0f} (past 2^24 positions float32, in which RoPE angles are "
            f"computed, stops telling neighbouring positions apart), got {value!r}."
        )
    return value


def positive_number(name: str, value: Any) -> float:
    value = real_number(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}.")
    return value


def attention_scale(name: str, value: Any) -> float:
    """An attention factor ``a``: > 0, with ``a^2`` finite in float32 (it multiplies cos and sin, so q.k by ``a^2``)."""
    value = positive_number(name, value)
    if value * value > FLOAT32_MAX:
        raise ValueError(
            f"{name} must be at most {math.sqrt(FLOAT32_MAX):.4g} (it multiplies q.k by its square, which float32 "
            f"must hold), got {value!r}."
        )
    return value


def rope_base(value: Any) -> float:
    """The RoPE base ``b`` (``rope_theta``): a finite number > 1, so that ``theta_i = b^(-2i/d)`` decreases from 1."""
    value = real_number("base", value)
    if value <= 1.0:
        raise ValueError(
            f"base (the RoPE base b, rope_theta) must be > 1 so that theta_i = b^(-2i/d) decreases from 1, "
            f"got {value!r}."
        )
    return value


def positive_int(name: str, value: Any, most: int | None = None) -> int:
    """``value`` as an ``int``: a positive integer (not a bool; numpy integers too), at most ``most`` when given.

    Args:
        name (`str`): the parameter's name, for the error.
        value (`Any`): the value to check.
        most (`int`, *optional*): the largest value allowed.

    Raises:
        ValueError: ``value`` is not a positive integer, or is above ``most``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    if most is not None and value > most:
        raise ValueError(f"{name} must be at most {most}, got {value!r}.")
    return int(value)


@documented
@dataclass(frozen=True, kw_only=True)
class RopeParams:
    """Parameters every RoPE method has."""

    original_max_position_embeddings: int | None = setting(
        None,
        help="the trained context ``L``. ``patch`` fills it from the model's config when omitted.",
    )

    def __post_init__(self) -> None:
        if self.original_max_position_embeddings is not None:
            # at most 2^53: the math is float64, whose integers are exact up to there
            context = positive_int("original_max_position_embeddings", self.original_max_position_embeddings, 2**53)
            self._set("original_max_position_embeddings", context)

    @property
    def context(self) -> int:
        """``L``; raises if it was never resolved."""
        if self.original_max_position_embeddings is None:
            raise ValueError("original_max_position_embeddings (the trained context L) is required here.")
        return self.original_max_position_embeddings

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)


@documented
@dataclass(frozen=True, kw_only=True)
class ScaledRopeParams(RopeParams):
    """The parameters of a RoPE scaling by a factor ``s``."""

    factor: float = setting(help="``s = L'/L`` >= 1.")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("factor", scale_factor(self.factor))


def rope_inv_freq(
    head_dim: int, base: float, *, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
) -> torch.Tensor:
    """RoFormer (Su et al., 2021, arXiv 2104.09864), eq. 15: ``theta_i = base^(-2i/d)`` for pairs
    ``i = 0 .. d/2 - 1``, computed in float64.

    Args:
        head_dim (`int`): the rotary dimension ``d``, even and >= 2.
        base (`float`): the RoPE base ``b`` (``rope_theta``), a finite number > 1.
        dtype (`torch.dtype`, defaults to float64): dtype of the result.
        device (`torch.device` or `str`, *optional*): where the result is made.

    Returns:
        `torch.Tensor`: the ``d // 2`` inverse frequencies, decreasing from 1.

    Raises:
        ValueError: ``head_dim`` is odd or below 2, or ``base`` is not finite or not > 1.
        TypeError: ``base`` is not a number.
    """
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"The rotary dimension must be even and >= 2, got {head_dim}.")
    exponent = torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim
    return (rope_base(base) ** -exponent).to(dtype)


def frequency_problem(inv_freq: torch.Tensor, attention_factor: float) -> str | None:
    """Why RoPE frequencies are unusable, or None: every ``theta_i'`` must be finite and > 0 in float32 (the dtype
    models keep them in: 0 would stop the rotation, inf make NaN), and the attention factor as :func:`attention_scale`
    says. Frequencies on the meta device (transformers builds a model there before loading its weights) have no
    values to check: the same parameters are checked where the model computes them for real."""
    as_float32 = inv_freq.float()
    if not as_float32.is_meta and not bool((as_float32.isfinite() & (as_float32 > 0)).all()):
        return (
            f"gives inverse frequencies from {inv_freq.min().item():.4g} to {inv_freq.max().item():.4g}; RoPE needs "
            "each finite and > 0 in float32 (the dtype models keep them in). Use values closer to the model's own."
        )
    if not (attention_factor > 0 and attention_factor * attention_factor <= FLOAT32_MAX):  # NaN fails too
        return f"gives the attention factor {attention_factor!r}; it must be > 0, its square finite in float32."
    return None


def wavelengths(inv_freq: torch.Tensor) -> torch.Tensor:
    """``lambda_i = 2*pi / theta_i`` (YaRN paper §3.2, Eq. for the wavelength)."""
    return 2 * math.pi / inv_freq
