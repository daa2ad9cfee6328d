"""STRING, ShifTed Rotary position embeddING (An et al. 2025, "Why Does the Effective Context Length of LLMs Fall
Short?", ICLR 2025, arXiv 2410.18745, §4; HKUNLP/STRING): the relative positions a model rarely saw in training,
the largest ones, are overwritten by well-trained smaller ones.

Query ``i``, key ``j <= i``, relative position ``d = i - j``, shifted offset ``S``, local value ``W < S``:

* ``d < S``: the true positions (the neighbour band, the model as trained);
* otherwise the query at ``i - S + W`` and the key at ``j``: the relative position ``d - S + W``.

One softmax over all of a query's keys. The largest relative position is ``max(S - 1, n - 1 - S + W)`` for ``n``
tokens: STRING changes attention inside the trained context ``L`` too, and keeps every position below ``L`` up to
``n = L + S - W`` tokens.

Where the authors' code and the paper differ, hf_posenc follows the paper's equation: each pair in one segment. The
prefill of ``string_for_llama.py`` (flash attention with ``window_size=[S, 0]`` beside the shifted triangle) scores
the keys at ``d = S`` twice, once at ``S`` and once at ``W``; its decoding step and the equation score them once,
at ``W``. The same code multiplies RoPE's ``cos`` and ``sin`` by ``0.1 ln 2 + 1``, so every logit by its square,
which the paper's equations do not show: ``attention_factor`` (default that value, as the authors ran STRING; 1
gives the equations alone).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..fields import documented, setting
from ..registry import Method, register
from ._common import attention_scale, positive_int
from .remap import BandRemapParams

SHIFTED_RATIO = 0.33  # the authors' README: shifted_offset=int(0.33 * L)
LOCAL_VALUE = 128
ATTENTION_FACTOR = 0.1 * math.log(2) + 1  # string_for_llama.py's attention_factor on cos and sin


def string_reach(context: int, shifted_offset: int, local_value: int) -> int:
    """``L + S - W``: the longest input whose every relative position stays below ``L`` under STRING (An et al.
    2025, arXiv 2410.18745, §4).

    Args:
        context (`int`): the trained context ``L``.
        shifted_offset (`int`): ``S``.
        local_value (`int`): ``W``.
    """
    return context + shifted_offset - local_value


@documented
@dataclass(frozen=True, kw_only=True)
class StringParams(BandRemapParams):
    """STRING: true positions below the shifted offset, shifted down past it (An et al. 2025)."""

    SEGMENTS: ClassVar[tuple[str, ...]] = ("neighbour", "shifted")
    TRUE_DISTANCES: ClassVar[tuple[bool, ...]] = (True, False)
    KEY_SEGMENTS: ClassVar[tuple[int, ...]] = (0, 0)  # the shifted segment's keys sit at their true positions
    REACH_FORMULA: ClassVar[str] = "L + S - W"

    shifted_offset: int | None = setting(
        None,
        help="``S``, below ``L``: relative positions from ``S`` on are moved down by ``S - W`` (the ``S - W`` largest "
        "positions are no longer used). Defaults to ``int(0.33 L)``, the authors' (they suggest 0.25 to 0.4 L).",
    )
    local_value: int | None = setting(
        None,
        help="``W``, from 1 to ``S - 1``: the relative position the shifted pairs start from. Defaults to 128, the "
        "authors' (they suggest 128, 256 or 512).",
    )
    attention_factor: float = setting(
        ATTENTION_FACTOR,
        help="multiplies q and k (every logit by its square), as the authors' code multiplies RoPE's cos and sin; "
        "defaults to theirs, ``0.1 ln 2 + 1``; 1 gives the paper's equations alone.",
    )
    max_position_embeddings: int | None = setting(
        None,
        help="the longest input the patched model must serve (written to the config); an error if the reach "
        "``L + S - W`` is shorter. Defaults to the reach.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("shifted_offset", "local_value", "max_position_embeddings"):
            if getattr(self, name) is not None:
                self._set(name, positive_int(name, getattr(self, name)))
        self._set("attention_factor", attention_scale("attention_factor", self.attention_factor))
        if self.original_max_position_embeddings is not None:
            self._resolve(self.original_max_position_embeddings)
        elif None not in (self.shifted_offset, self.local_value):
            self._check_local_value()

    def _resolve(self, context: int) -> None:
        """The defaults that need ``L``, and the checks against it."""
        if self.shifted_offset is None:
            self._set("shifted_offset", max(1, int(SHIFTED_RATIO * context)))
        if self.local_value is None:
            self._set("local_value", LOCAL_VALUE)
        if self.shifted_offset >= context:
            raise ValueError(
                f"shifted_offset must be below the trained context L={context}, got {self.shifted_offset}."
            )
        self._check_local_value()
        reach = string_reach(context, self.shifted_offset, self.local_value)
        if self.max_position_embeddings is None:
            self._set("max_position_embeddings", reach)
        elif not context <= self.max_position_embeddings <= reach:
            raise ValueError(
                f"max_position_embeddings (the longest input to serve) must be from the trained context L={context} "
                f"to STRING's reach L + S - W = {reach} (shifted_offset={self.shifted_offset}, local_value="
                f"{self.local_value}), got {self.max_position_embeddings}; a larger shifted_offset reaches further."
            )

    def _check_local_value(self) -> None:
        if self.local_value >= self.shifted_offset:
            given = "the default local_value" if self.local_value == LOCAL_VALUE else "local_value"
            raise ValueError(
                f"{given} {self.local_value} must be below shifted_offset={self.shifted_offset} (the shifted positions "
                f"start at it, below the neighbour band's; equal, nothing moves): give local_value from 1 to "
                f"{self.shifted_offset - 1}."
            )

    @property
    def band(self) -> int:
        return self.shifted_offset

    @property
    def query_scale(self) -> float:
        return self.attention_factor**2

    @property
    def reach(self) -> int | None:
        context = self.original_max_position_embeddings
        return None if context is None else string_reach(context, self.shifted_offset, self.local_value)

    def query_position(self, segment: int, i: torch.Tensor) -> torch.Tensor:
        return i if segment == 0 else i - self.shifted_offset + self.local_value

    def key_position(self, segment: int, j: torch.Tensor) -> torch.Tensor:
        return j


register(
    Method(
        name="string",
        aliases=("string-rope",),
        params=StringParams,
        role="remap",
        depends_on_length=False,
        paper="An et al. 2025, Why Does the Effective Context Length of LLMs Fall Short? (ICLR 2025, arXiv 2410.18745)",
        summary="Training-free: relative positions past S shifted down to start at W, inside L too; reaches "
        "L + S - W tokens.",
    )
)
