"""ReRoPE and Leaky ReRoPE (Su 2023, "Transformer升级之路：12、无限外推的ReRoPE？", kexue.fm/archives/9708; code
bojone/rerope, ``rerope_patch.py`` and ``leaky_rerope_patch.py``): relative positions kept inside a window ``w``,
rectified past it.

Query ``i``, key ``j <= i``, relative position ``d = i - j``:

* ``d < w``: the true positions (the window);
* ReRoPE, otherwise: the query at ``w`` and the key at ``0``, so every farther pair sits at ``w`` (the blog's eq. 3,
  ``min(d, w)``, a ReLU on the relative position);
* Leaky ReRoPE, otherwise: the query at ``(i + w (k - 1)) / k`` and the key at ``j / k``, so the pair sits at
  ``w + (d - w) / k`` (eq. 4): past the window, positions grow by ``1/k`` a token, as position interpolation does.

One softmax over all of a query's keys. ReRoPE keeps every relative position at most ``w``: any length runs. Leaky
ReRoPE's largest relative position for ``n`` tokens is ``w + (n - 1 - w) / k``, below ``L`` up to
``n = w + 1 + floor(k (L - 1 - w))`` tokens.

The authors' code also multiplies each query by Qwen's log-n factor ``max(1, ln(p + 1) / ln L)``, which the
blog's equations do not have: here that is the combination with log-n, ``"rerope+logn"``
(``"leaky-rerope+logn"``), which equals the authors' code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..fields import documented, setting
from ..registry import Method, register
from ._common import positive_int, real_number
from .remap import BandRemapParams

WINDOW_RATIO = 8  # the authors' code: window = 512 for training_length = 4096
DEFAULT_K = 16.0  # leaky_rerope_patch.py's scaling_factor
MAX_K = 2.0**24  # as the RoPE scalings' factor: the reach stays an exact float64 integer


@documented
@dataclass(frozen=True, kw_only=True)
class ReRoPEParams(BandRemapParams):
    """ReRoPE: true positions inside the window, every farther pair at the window's edge (Su 2023)."""

    SEGMENTS: ClassVar[tuple[str, ...]] = ("window", "capped")
    TRUE_DISTANCES: ClassVar[tuple[bool, ...]] = (True, False)

    window: int | None = setting(
        None,
        help="``w``, below ``L``: relative positions below it are kept, every larger one is ``w``. Defaults to "
        "``L / 8``, the authors' (512 for a model trained on 4096).",
    )
    max_position_embeddings: int | None = setting(
        None,
        help="the longest input the patched model is meant to serve, at least ``L``, written to the config (what vLLM "
        "and lm-evaluation-harness take as the model's length). ReRoPE itself has no longest input; by default the "
        "config's value is kept.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("window", "max_position_embeddings"):
            if getattr(self, name) is not None:
                self._set(name, positive_int(name, getattr(self, name)))
        if self.original_max_position_embeddings is not None:
            self._resolve(self.original_max_position_embeddings)

    def _resolve(self, context: int) -> None:
        """The defaults that need ``L``, and the checks against it."""
        if self.window is None:
            self._set("window", max(1, context // WINDOW_RATIO))
        if self.window >= context:
            raise ValueError(f"window must be below the trained context L={context}, got {self.window}.")
        if self.max_position_embeddings is not None and self.max_position_embeddings < context:
            raise ValueError(
                f"max_position_embeddings (the longest input to serve) must be at least the trained context "
                f"L={context}, got {self.max_position_embeddings}."
            )

    @property
    def band(self) -> int:
        return self.window

    def query_position(self, segment: int, i: torch.Tensor) -> torch.Tensor:
        return i if segment == 0 else torch.full_like(i, self.window)

    def key_position(self, segment: int, j: torch.Tensor) -> torch.Tensor:
        return j if segment == 0 else torch.zeros_like(j)


def leaky_rerope_reach(context: int, window: int, k: float) -> int:
    """``w + 1 + floor(k (L - 1 - w))``: the longest input whose every relative position, ``w + (d - w) / k`` past
    the window, stays below ``L`` under Leaky ReRoPE (Su 2023, kexue.fm/archives/9708, eq. 4).

    Args:
        context (`int`): the trained context ``L``.
        window (`int`): ``w``.
        k (`float`): the slope's inverse, ``k >= 1``.
    """
    return window + 1 + math.floor(k * (context - 1 - window))


def _k_reaching(target: int, context: int, window: int) -> float:
    """The smallest float ``k >= 1`` with ``w + 1 + floor(k (L - 1 - w)) >= T``: ``(T - 1 - w) / (L - 1 - w)``,
    stepped up past float rounding, so a ``T``-token input's farthest pair sits at ``L - 1`` at most."""
    k = max(1.0, (target - 1 - window) / (context - 1 - window))
    while leaky_rerope_reach(context, window, k) < target:
        k = math.nextafter(k, math.inf)
    return k


@documented
@dataclass(frozen=True, kw_only=True)
class LeakyReRoPEParams(ReRoPEParams):
    """Leaky ReRoPE: true positions inside the window, positions growing by ``1/k`` a token past it (Su 2023)."""

    SEGMENTS: ClassVar[tuple[str, ...]] = ("window", "leaky")
    REACH_FORMULA: ClassVar[str] = "w + 1 + floor(k (L - 1 - w))"

    k: float | None = setting(
        None,
        help="``k >= 1``: past the window a pair sits at ``w + (d - w) / k``. Defaults to ``(T - 1 - w) / "
        "(L - 1 - w)`` for a ``max_position_embeddings`` ``T`` given (the farthest pair of a ``T``-token input then "
        "sits at ``L - 1``, the largest trained position; at least 1), else 16, the authors' code's.",
    )
    max_position_embeddings: int | None = setting(
        None,
        help="the longest input the patched model must serve (written to the config); an error if the reach "
        "``w + 1 + floor(k (L - 1 - w))`` is shorter. Defaults to the reach.",
    )

    def __post_init__(self) -> None:
        if self.k is not None:
            k = real_number("k", self.k)
            if not 1 <= k <= MAX_K:
                raise ValueError(f"k must be a number from 1 (RoPE itself) to 2^24, got {self.k!r}.")
            self._set("k", k)
        super().__post_init__()

    def _resolve(self, context: int) -> None:
        super()._resolve(context)
        target = self.max_position_embeddings
        if target is not None and target > context and self.window > context - 2:
            raise ValueError(
                f"window must be at most L - 2 = {context - 2} for Leaky ReRoPE to reach past L={context} "
                f"(max_position_embeddings={target}): past a window of L - 1 no position grows; got {self.window}."
            )
        if self.k is None:
            self._set("k", DEFAULT_K if target is None else _k_reaching(target, context, self.window))
            if self.k > MAX_K:
                raise ValueError(
                    f"max_position_embeddings={target} needs k = {self.k:.4g} with window={self.window} on "
                    f"L={context}, above 2^24; a larger window reaches further at a smaller k."
                )
        reach = leaky_rerope_reach(context, self.window, self.k)
        if target is None:
            self._set("max_position_embeddings", reach)
        elif target > reach:
            raise ValueError(
                f"Leaky ReRoPE with window={self.window}, k={self.k:g} on L={context} reaches w + 1 + floor(k (L - 1 - "
                f"w)) = {reach} tokens, fewer than max_position_embeddings={target}; use a larger k."
            )

    @property
    def reach(self) -> int | None:
        context = self.original_max_position_embeddings
        return None if context is None else leaky_rerope_reach(context, self.window, self.k)

    def query_position(self, segment: int, i: torch.Tensor) -> torch.Tensor:
        if segment == 0:
            return i
        return (i.to(torch.float64) + self.window * (self.k - 1)) / self.k

    def key_position(self, segment: int, j: torch.Tensor) -> torch.Tensor:
        return j if segment == 0 else j.to(torch.float64) / self.k


register(
    Method(
        name="rerope",
        aliases=("re-rope",),
        params=ReRoPEParams,
        role="remap",
        depends_on_length=False,
        paper="Su 2023, Transformer升级之路：12、无限外推的ReRoPE？ (kexue.fm/archives/9708; bojone/rerope)",
        summary="Training-free: relative positions kept below the window w, every farther one set to w; any length "
        "runs.",
    )
)
register(
    Method(
        name="leaky-rerope",
        aliases=("leaky_rerope",),
        params=LeakyReRoPEParams,
        role="remap",
        depends_on_length=False,
        paper="Su 2023, Transformer升级之路：12、无限外推的ReRoPE？ (kexue.fm/archives/9708; bojone/rerope)",
        summary="Training-free: relative positions kept below the window w, growing by 1/k past it; reaches "
        "w + 1 + floor(k (L - 1 - w)) tokens.",
    )
)
