"""NTK-by-parts and YaRN, static and dynamic (Peng, Quesnelle, Fan, Shippole 2023, arXiv 2309.00071).

The blend between keeping a pair's frequency (high frequencies, many rotations inside the trained
context) and interpolating it by ``s`` (low frequencies) has two forms:

* ``ramp="index"`` (default): linear over the pair index between the "correction dims" of
  ``beta_fast`` and ``beta_slow``, floored/ceiled when ``truncate``. This is the paper authors'
  released code, what transformers' ``rope_type: "yarn"`` computes and what published YaRN models
  were fine-tuned with, so a patched config loads natively. Over ``r`` it is linear in ``log r``.
* ``ramp="ratio"``: the paper's §3.2 definition verbatim, linear in ``r = L / lambda``:
  ``gamma(r) = 0 if r < alpha; 1 if r > beta; (r - alpha) / (beta - alpha) otherwise`` with
  ``alpha = beta_slow``, ``beta = beta_fast``. transformers cannot express it; it is recorded under
  hf_posenc's own rope type.

Both agree outside the blend band and in direction: ``gamma = 1`` keeps ``theta``, ``gamma = 0``
gives ``theta / s``. Where the index band lies wholly outside the pairs, the released ramp's clamping turns it
around; those parameters are refused (:func:`_check_index_band`).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch

from ..fields import documented, setting
from ..registry import Method, register
from ._common import (
    RopeParams,
    ScaledRopeParams,
    attention_scale,
    positive_number,
    real_number,
    rope_base,
    rope_inv_freq,
)

RAMPS = ("index", "ratio")


@documented
@dataclass(frozen=True, kw_only=True)
class RampParams(RopeParams):
    """The ramp between keeping a pair's frequency and interpolating it (YaRN §3.2; the module docstring)."""

    beta_fast: float = setting(32.0, help="rotations over ``L`` above which a pair is kept (``beta``).")
    beta_slow: float = setting(1.0, help="rotations over ``L`` below which a pair is interpolated (``alpha``).")
    ramp: str = setting(
        "index",
        help='``"index"`` (released code / transformers) or ``"ratio"`` (the paper\'s §3.2 formula); see the module'
        " docstring.",
    )
    truncate: bool = setting(True, help='floor/ceil the correction dims (``ramp="index"`` only).')

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("beta_fast", positive_number("beta_fast", self.beta_fast))
        self._set("beta_slow", positive_number("beta_slow", self.beta_slow))
        if self.beta_fast <= self.beta_slow:
            raise ValueError(
                f"beta_fast must be greater than beta_slow (the paper's beta > alpha), got "
                f"beta_fast={self.beta_fast} and beta_slow={self.beta_slow}."
            )
        if self.ramp not in RAMPS:
            raise ValueError(f"ramp must be one of {RAMPS}, got {self.ramp!r}.")
        if not isinstance(self.truncate, bool):
            raise TypeError(f"truncate must be True or False, got {self.truncate!r}.")


@documented
@dataclass(frozen=True, kw_only=True)
class NTKByPartsParams(RampParams, ScaledRopeParams):
    """The ramp's parameters and ``factor`` (``s = L'/L`` >= 1)."""


@documented
@dataclass(frozen=True, kw_only=True)
class YaRNParams(NTKByPartsParams):
    """YaRN: NTK-by-parts and an attention factor ``sqrt(1/t)`` (Peng et al. 2023, §3.4)."""

    attention_factor: float | None = setting(
        None,
        help="``sqrt(1/t)``, multiplying cos and sin (so q.k by its square; on a partial-rotary model, Phi or "
        "GPT-NeoX, only the rotated dimensions' part of q.k, as in transformers: the paper's ``1/t`` scales all "
        "of it). Defaults to the paper's ``0.1 ln(s) + 1`` (§3.4).",
    )
    mscale: float | None = setting(
        None,
        help="given together (both > 0), the attention factor is ``(0.1 mscale ln s + 1) / (0.1 mscale_all_dim ln s + "
        "1)``, the variant of the YaRN authors' code that DeepSeek-V2 configs use and transformers' ``yarn`` type"
        " reads. With ``attention_factor`` too, the two must agree.",
    )
    mscale_all_dim: float | None = setting(
        None,
        help="given together (both > 0), the attention factor is ``(0.1 mscale ln s + 1) / (0.1 mscale_all_dim ln s + "
        "1)``, the variant of the YaRN authors' code that DeepSeek-V2 configs use and transformers' ``yarn`` type"
        " reads. With ``attention_factor`` too, the two must agree.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        given = None if self.attention_factor is None else attention_scale("attention_factor", self.attention_factor)
        if (self.mscale is None) != (self.mscale_all_dim is None):
            raise ValueError("mscale and mscale_all_dim go together: give both or neither.")
        if self.mscale is None:
            self._set("attention_factor", yarn_attention_factor(self.factor) if given is None else given)
            return
        self._set("mscale", positive_number("mscale", self.mscale))
        self._set("mscale_all_dim", positive_number("mscale_all_dim", self.mscale_all_dim))
        kept, all_dims = (yarn_attention_factor(self.factor, mscale) for mscale in (self.mscale, self.mscale_all_dim))
        name = f"the attention factor of mscale={self.mscale} and mscale_all_dim={self.mscale_all_dim}"
        ratio = attention_scale(name, kept / all_dims)
        if given is not None and not math.isclose(given, ratio, rel_tol=1e-12):
            raise ValueError(
                f"attention_factor={given} disagrees with mscale={self.mscale} and mscale_all_dim="
                f"{self.mscale_all_dim}, which give {ratio}; give one or the other."
            )
        self._set("attention_factor", ratio)


def yarn_attention_factor(factor: float, mscale: float = 1.0) -> float:
    """YaRN §3.4: ``sqrt(1/t) = 0.1 ln(s) + 1`` (1 for ``s <= 1``); ``mscale`` multiplies the ``0.1``."""
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def correction_dim(rotations: float, head_dim: int, base: float, context: int, name: str = "rotations") -> float:
    """The (fractional) pair index whose wavelength fits ``rotations`` times into ``context``,
    ``d * ln(L / (2 pi n)) / (2 ln b)``: the inverse of ``r(i) = L / lambda_i`` with ``lambda_i = 2 pi b^(2i/d)``
    (YaRN, Peng et al., 2023, arXiv 2309.00071, eqs. 17 and 13), the released code's "correction dim".

    Args:
        rotations (`float`): ``n``, rotations over ``L`` (``beta_fast`` or ``beta_slow``), > 0.
        head_dim (`int`): the rotary dimension ``d``.
        base (`float`): the RoPE base ``b``.
        context (`int`): the trained context ``L``.
        name (`str`, defaults to ``"rotations"``): the parameter ``rotations`` comes from, named in the error.

    Raises:
        ValueError: ``L / (2 pi n)`` is no finite float > 0, or ``base`` is not finite or not > 1.
    """
    if not 0 < context / (rotations * 2 * math.pi) < math.inf:
        low, high = context / (2 * math.pi) / sys.float_info.max, sys.float_info.max / (2 * math.pi)
        raise ValueError(
            f"{name}={rotations!r} is out of range for the YaRN ramp, which takes ln(L / (2 pi {name})) with "
            f"L={context}: {name} must lie between {low:.3g} and {high:.3g}."
        )
    return head_dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(rope_base(base)))


def keep_fraction(params: RampParams, inv_freq: torch.Tensor, head_dim: int, base: float) -> torch.Tensor:
    """``gamma_i`` in [0, 1] for each pair: 1 keeps ``theta_i`` (extrapolate), 0 divides it by ``s`` (interpolate).

    ``ramp="ratio"``: the ramp of YaRN (Peng et al., 2023, arXiv 2309.00071), eq. 18, on ``r = L / lambda_i``
    (eq. 17), ``alpha = beta_slow``, ``beta = beta_fast``. ``ramp="index"``: linear over the pair index between the
    correction dims of ``beta_fast`` and ``beta_slow`` (:func:`correction_dim`, floored and ceiled with
    ``truncate``), as the released code and transformers compute it (the module docstring).

    Args:
        params (`RampParams`): ``beta_fast``, ``beta_slow``, ``ramp``, ``truncate`` and the trained context ``L``.
        inv_freq (`torch.Tensor`): the unscaled ``theta_i``, ``d // 2`` values; the result takes its dtype and
            device.
        head_dim (`int`): the rotary dimension ``d``.
        base (`float`): the RoPE base ``b`` (read by ``ramp="index"``).

    Raises:
        ValueError: with ``ramp="index"``, a band wholly outside the pairs (where the released ramp runs
            backwards) or a correction dim out of range (:func:`correction_dim`).
    """
    context = params.context
    if params.ramp == "ratio":
        ratio = context * inv_freq / (2 * math.pi)  # r = L / lambda
        return ((ratio - params.beta_slow) / (params.beta_fast - params.beta_slow)).clamp(0, 1)
    low = correction_dim(params.beta_fast, head_dim, base, context, "beta_fast")
    high = correction_dim(params.beta_slow, head_dim, base, context, "beta_slow")
    if params.truncate:
        low, high = math.floor(low), math.ceil(high)
    _check_index_band(params, head_dim, low, high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a single-index band; the released code widens it the same way
    index = torch.arange(head_dim // 2, dtype=inv_freq.dtype, device=inv_freq.device)
    return 1 - ((index - low) / (high - low)).clamp(0, 1)


def _check_index_band(params: RampParams, head_dim: int, low: float, high: float) -> None:
    """Raise ``ValueError`` where the released index ramp runs against §3.2: its band wholly below the first pair
    (``L <= 2 pi beta_slow``: every pair turns fewer than ``beta_slow`` times, and the paper interpolates all, where the
    clamped ramp keeps pair 0 or all) or past ``head_dim - 1`` (every pair turns more than ``beta_fast`` times, and
    the paper keeps all, where the clamped ramp interpolates all). transformers computes the same inverted ramp from
    such a config, so it is refused rather than computed otherwise."""
    if high <= 0:
        said = (
            f"L={params.context} <= 2 pi beta_slow = {2 * math.pi * params.beta_slow:.4g}: every pair turns fewer "
            "than beta_slow times in the trained context, so the paper (YaRN §3.2) interpolates them all, where "
            "it keeps some"
        )
    elif low > head_dim - 1:
        said = (
            f"every pair turns more than beta_fast={params.beta_fast} times in L={params.context} tokens, so the paper "
            "(YaRN §3.2) keeps all of them, where it interpolates all"
        )
    else:
        return
    raise ValueError(
        f"ramp='index' (the released code's, transformers' yarn) runs backwards here: {said}. Use ramp='ratio' (the "
        "paper's ramp), or other beta_fast / beta_slow."
    )


def by_parts_inv_freq(
    params: RampParams, factor: float, *, head_dim: int, base: float, dtype=torch.float64, device=None
) -> torch.Tensor:
    """NTK-by-parts, YaRN (Peng et al., 2023, arXiv 2309.00071), eq. 20:
    ``theta_i' = (1 - gamma_i) theta_i / s + gamma_i theta_i``, ``gamma_i`` from :func:`keep_fraction`; computed in
    float64.

    Args:
        params (`RampParams`): the ramp's parameters and the trained context ``L``.
        factor (`float`): the scale ``s`` (``params.factor``, or the dynamic one of the current length).
        head_dim (`int`): the rotary dimension ``d``.
        base (`float`): the RoPE base ``b`` (``rope_theta``).
        dtype (`torch.dtype`, defaults to float64): dtype of the result.
        device (`torch.device` or `str`, *optional*): where the result is made.

    Raises:
        ValueError: as :func:`keep_fraction` and :func:`~hf_posenc.methods._common.rope_inv_freq` refuse their
            inputs.
    """
    theta = rope_inv_freq(head_dim, base, device=device)
    gamma = keep_fraction(params, theta, head_dim, base)
    return ((1 - gamma) * theta / factor + gamma * theta).to(dtype)


def ntk_by_parts_frequencies(
    params: NTKByPartsParams, *, head_dim: int, base: float, seq_len=None, dtype=torch.float64, device=None
) -> tuple[torch.Tensor, float]:
    inv_freq = by_parts_inv_freq(params, params.factor, head_dim=head_dim, base=base, dtype=dtype, device=device)
    return inv_freq, 1.0


def yarn_frequencies(
    params: YaRNParams, *, head_dim: int, base: float, seq_len=None, dtype=torch.float64, device=None
) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al., 2023, arXiv 2309.00071), §3.4: NTK-by-parts (eq. 20, :func:`by_parts_inv_freq`) and the
    attention factor ``sqrt(1/t)`` of eq. 21, multiplying cos and sin (by default eq. 22's ``0.1 ln s + 1``).

    Args:
        params (`YaRNParams`): ``factor``, the ramp's parameters, the trained context ``L`` and the resolved
            ``attention_factor``.
        head_dim (`int`): the rotary dimension ``d``.
        base (`float`): the RoPE base ``b`` (``rope_theta``).
        seq_len (`int`, *optional*): not read (static); part of the methods' ``frequencies`` signature.
        dtype (`torch.dtype`, defaults to float64): dtype of the returned ``inv_freq``.
        device (`torch.device` or `str`, *optional*): where ``inv_freq`` is made.

    Returns:
        `tuple[torch.Tensor, float]`: ``theta_i'`` (``d // 2`` values) and ``params.attention_factor``.

    Raises:
        ValueError: as :func:`by_parts_inv_freq` refuses its inputs.
    """
    inv_freq = by_parts_inv_freq(params, params.factor, head_dim=head_dim, base=base, dtype=dtype, device=device)
    return inv_freq, params.attention_factor


def dynamic_yarn_frequencies(
    params: RampParams, *, head_dim: int, base: float, seq_len: int | None = None, dtype=torch.float64, device=None
) -> tuple[torch.Tensor, float]:
    """Dynamic YaRN (Peng et al., 2023, arXiv 2309.00071), §3.3: YaRN with ``s = max(1, l / L)`` for the current
    length ``l``, and the attention factor of eq. 22, ``0.1 ln s + 1``.

    Args:
        params (`RampParams`): the ramp's parameters and the trained context ``L``.
        head_dim (`int`): the rotary dimension ``d``.
        base (`float`): the RoPE base ``b`` (``rope_theta``).
        seq_len (`int`, *optional*): the current length ``l``; None gives ``s = 1``.
        dtype (`torch.dtype`, defaults to float64): dtype of the returned ``inv_freq``.
        device (`torch.device` or `str`, *optional*): where ``inv_freq`` is made.

    Returns:
        `tuple[torch.Tensor, float]`: ``theta_i'`` (``d // 2`` values) and the attention factor.

    Raises:
        ValueError: ``seq_len`` not finite, or as :func:`by_parts_inv_freq` refuses its inputs.
        TypeError: ``seq_len`` is not a number.
    """
    factor = max(1.0, real_number("seq_len", seq_len or 0) / params.context)
    inv_freq = by_parts_inv_freq(params, factor, head_dim=head_dim, base=base, dtype=dtype, device=device)
    return inv_freq, yarn_attention_factor(factor)


def _yarn_rope_parameters(params: NTKByPartsParams, attention_factor: float) -> dict | None:
    """transformers' ``rope_type: "yarn"``, which computes the index ramp only (``ramp="ratio"``: None)."""
    if params.ramp != "index":
        return None
    return {
        "rope_type": "yarn",
        "factor": params.factor,
        "original_max_position_embeddings": params.context,
        "beta_fast": params.beta_fast,
        "beta_slow": params.beta_slow,
        "attention_factor": attention_factor,
        "truncate": params.truncate,
        **mscale_pair(
            params.factor, attention_factor, getattr(params, "mscale", None), getattr(params, "mscale_all_dim", None)
        ),
    }


def mscale_pair(factor: float, attention_factor: float, mscale: float | None, mscale_all_dim: float | None) -> dict:
    """``mscale`` / ``mscale_all_dim`` saying ``attention_factor`` to the readers that take YaRN's attention factor
    only from their ratio ``(0.1 mscale ln s + 1) / (0.1 mscale_all_dim ln s + 1)`` (SGLang, TGI; transformers and
    vLLM read ``attention_factor`` first): the pair given, else ``mscale_all_dim = 1`` and the ``mscale`` whose ratio
    is ``attention_factor``. Empty where the factor is YaRN's default ``0.1 ln s + 1`` (what they compute without
    the pair), for ``s <= 1``, and where no positive ``mscale`` gives it.

    Args:
        factor (`float`): the scale ``s``.
        attention_factor (`float`): the attention factor the pair must say.
        mscale (`float` or `None`): the ``mscale`` given, if any.
        mscale_all_dim (`float` or `None`): the ``mscale_all_dim`` given, if any.

    Returns:
        `dict`: ``{"mscale": ..., "mscale_all_dim": ...}``, or empty.
    """
    if mscale is not None and mscale_all_dim is not None:
        return {"mscale": mscale, "mscale_all_dim": mscale_all_dim}
    if factor <= 1 or math.isclose(attention_factor, yarn_attention_factor(factor), rel_tol=1e-12):
        return {}
    x = 0.1 * math.log(factor)
    needed = attention_factor + (attention_factor - 1) / x  # (a (x + 1) - 1) / x, exactly 1 for a = 1
    return {"mscale": needed, "mscale_all_dim": 1.0} if needed > 0 else {}


def ntk_by_parts_transformers_rope(params: NTKByPartsParams, head_dim: int, base: float) -> dict | None:
    return _yarn_rope_parameters(params, 1.0)


def yarn_transformers_rope(params: YaRNParams, head_dim: int, base: float) -> dict | None:
    return _yarn_rope_parameters(params, params.attention_factor)


register(
    Method(
        name="ntk-by-parts",
        params=NTKByPartsParams,
        frequencies=ntk_by_parts_frequencies,
        transformers_rope=ntk_by_parts_transformers_rope,
        depends_on_length=False,
        paper="Peng et al. 2023, YaRN (arXiv 2309.00071) §3.2",
        summary="YaRN without the attention temperature: high frequencies kept, low ones interpolated.",
    )
)
register(
    Method(
        name="yarn",
        params=YaRNParams,
        frequencies=yarn_frequencies,
        transformers_rope=yarn_transformers_rope,
        depends_on_length=False,
        paper="Peng et al. 2023, YaRN: Efficient Context Window Extension of LLMs (arXiv 2309.00071) §3.4",
        summary="Best training-free choice at small s; with a short fine-tune the paper reaches 128k.",
    )
)
register(
    Method(
        name="dynamic-yarn",
        params=RampParams,
        frequencies=dynamic_yarn_frequencies,
        dynamic=True,
        unchanged_within_context=True,
        depends_on_length=True,
        paper="Peng et al. 2023, YaRN (arXiv 2309.00071) §3.3",
        summary="Training-free; the unpatched model up to L, YaRN with s = l/L past it.",
    )
)
