"""Reference formulas written straight from the papers, pair by pair in plain Python floats.

Independent of hf_posenc's tensor code on purpose: the tests compare the two.
"""

from __future__ import annotations

import math


def theta(d: int, b: float) -> list[float]:
    """RoFormer: theta_i = b^(-2i/d), i = 0 .. d/2-1."""
    return [b ** (-2 * i / d) for i in range(d // 2)]


def pi(d, b, L, s):
    return [t / s for t in theta(d, b)], 1.0


def ntk(d, b, L, s):
    return theta(d, b * s ** (d / (d - 2))), 1.0


def dynamic_ntk(d, b, L, s, l):
    if l <= L:
        return theta(d, b), 1.0
    return theta(d, b * ((s * l / L) - (s - 1)) ** (d / (d - 2))), 1.0


def gamma_ratio(r: float, alpha: float, beta: float) -> float:
    """YaRN §3.2: gamma(r) = 0 if r < alpha, 1 if r > beta, (r - alpha)/(beta - alpha) otherwise."""
    if r < alpha:
        return 0.0
    if r > beta:
        return 1.0
    return (r - alpha) / (beta - alpha)


def gamma_index(i: int, d: int, b: float, L: int, beta_fast: float, beta_slow: float, truncate: bool = True) -> float:
    """Released YaRN code / transformers: linear over the pair index between the correction dims."""

    def dim_of(rotations):  # the pair index whose wavelength fits `rotations` times into L
        return d * math.log(L / (rotations * 2 * math.pi)) / (2 * math.log(b))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    return 1 - min(1.0, max(0.0, (i - low) / (high - low)))


def by_parts(d, b, L, s, beta_fast=32.0, beta_slow=1.0, ramp="index", truncate=True):
    """YaRN §3.2: h(theta_i) = (1 - gamma) theta_i / s + gamma theta_i, r = L / lambda_i."""
    out = []
    for i, t in enumerate(theta(d, b)):
        if ramp == "ratio":
            g = gamma_ratio(L / (2 * math.pi / t), beta_slow, beta_fast)
        else:
            g = gamma_index(i, d, b, L, beta_fast, beta_slow, truncate)
        out.append((1 - g) * t / s + g * t)
    return out


def yarn(d, b, L, s, **kw):
    """YaRN §3.4: sqrt(1/t) = 0.1 ln(s) + 1."""
    return by_parts(d, b, L, s, **kw), 0.1 * math.log(s) + 1


def dynamic_yarn(d, b, L, l, **kw):
    """YaRN §3.3: s = max(1, l/L)."""
    s = max(1.0, l / L)
    return by_parts(d, b, L, s, **kw), (0.1 * math.log(s) + 1 if s > 1 else 1.0)


def llama3(d, b, L, s, low=1.0, high=4.0):
    out = []
    for t in theta(d, b):
        wavelength = 2 * math.pi / t
        if wavelength < L / high:
            out.append(t)
        elif wavelength > L / low:
            out.append(t / s)
        else:
            smooth = (L / wavelength - low) / (high - low)
            out.append((1 - smooth) * t / s + smooth * t)
    return out, 1.0


def longrope(d, b, L, s, long_factor, short_factor, l):
    factors = long_factor if l is not None and l > L else short_factor
    return [t / f for t, f in zip(theta(d, b), factors, strict=True)], math.sqrt(1 + math.log(s) / math.log(L))
