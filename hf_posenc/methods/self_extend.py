"""Self-Extend (Jin et al. 2024, "LLM Maybe LongLM: Self-Extend LLM Context Window Without Tuning",
arXiv 2401.01325, §3; datamllab/LongLM): neighbour attention at true positions, grouped attention past it.

Query ``i``, key ``j <= i``, group size ``G``, neighbour window ``W`` (a multiple of ``G``):

* ``i - j < W``: the true positions (the model as trained);
* otherwise: query position ``floor(i / G) + W - W / G``, key position ``floor(j / G)`` (the paper's
  grouped attention, shifted so the two meet at distance ``W``).

One softmax over the merged logits. The largest relative position is ``floor((n-1)/G) + W - W/G`` for ``n``
tokens, so a model trained on ``L`` positions reaches ``n = (L - W) * G + W`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..fields import documented, setting
from ..registry import Method, register
from ._common import positive_int
from .remap import BandRemapParams

DEFAULT_GROUP_SIZE = 8


def self_extend_reach(context: int, group_size: int, window: int) -> int:
    """``(L - W) * G + W``: the longest input whose every relative position stays below ``L`` (Self-Extend,
    Jin et al., 2024, arXiv 2401.01325, §3).

    Args:
        context (`int`): the trained context ``L``.
        group_size (`int`): the group size ``G``.
        window (`int`): the neighbour window ``W``.
    """
    return (context - window) * group_size + window


@documented
@dataclass(frozen=True, kw_only=True)
class SelfExtendParams(BandRemapParams):
    """Self-Extend: true positions inside the window, floor-divided ones past it (Jin et al. 2024)."""

    SEGMENTS: ClassVar[tuple[str, ...]] = ("neighbour", "grouped")
    TRUE_DISTANCES: ClassVar[tuple[bool, ...]] = (True, False)
    KEY_SEGMENTS: ClassVar[tuple[int, ...]] = (0, 1)
    REACH_FORMULA: ClassVar[str] = "(L - W) * G + W"

    group_size: int = setting(DEFAULT_GROUP_SIZE, help="``G``, positions past the window are floor-divided by it.")
    window: int | None = setting(
        None,
        help="``W``, the neighbour window at true positions; a multiple of ``G`` below ``L``. Defaults to ``L / 4`` "
        "rounded down to a multiple of ``G``.",
    )
    max_position_embeddings: int | None = setting(
        None,
        help="the longest input the patched model must serve (written to the config); an error if the reach ``(L - W) "
        "* G + W`` is shorter. Defaults to the reach.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        group = positive_int("group_size", self.group_size)
        self._set("group_size", group)
        if self.window is not None:
            window = positive_int("window", self.window)
            if window % group:
                raise ValueError(f"window must be a multiple of group_size={group}, got window={window}.")
            self._set("window", window)
        if self.max_position_embeddings is not None:
            self._set("max_position_embeddings", positive_int("max_position_embeddings", self.max_position_embeddings))
        if self.original_max_position_embeddings is not None:
            self._resolve(self.original_max_position_embeddings)

    def _resolve(self, context: int) -> None:
        """The defaults that need ``L``, and the checks against it."""
        if self.window is None:
            self._set("window", context // 4 // self.group_size * self.group_size)
            if self.window == 0:
                raise ValueError(
                    f"The default window L / 4 = {context // 4} holds no whole group of group_size={self.group_size}; "
                    "give window (a multiple of group_size, below L)."
                )
        if self.window >= context:
            raise ValueError(f"window must be below the trained context L={context}, got {self.window}.")
        reach = self_extend_reach(context, self.group_size, self.window)
        if self.max_position_embeddings is not None and self.max_position_embeddings < context:
            raise ValueError(
                f"max_position_embeddings (the longest input to serve) must be at least the trained context "
                f"L={context}, got {self.max_position_embeddings}."
            )
        if self.max_position_embeddings is None:
            self._set("max_position_embeddings", reach)
        elif self.max_position_embeddings > reach:
            raise ValueError(
                f"Self-Extend with group_size={self.group_size}, window={self.window} on L={context} reaches "
                f"(L - W) * G + W = {reach} tokens, fewer than max_position_embeddings={self.max_position_embeddings}; "
                "use a larger group_size or a smaller window."
            )

    @property
    def reach(self) -> int | None:
        context = self.original_max_position_embeddings
        return None if context is None else self_extend_reach(context, self.group_size, self.window)

    @property
    def band(self) -> int:
        return self.window

    def query_position(self, segment: int, i: torch.Tensor) -> torch.Tensor:
        if segment == 0:
            return i
        return torch.div(i, self.group_size, rounding_mode="floor") + self.window - self.window // self.group_size

    def key_position(self, segment: int, j: torch.Tensor) -> torch.Tensor:
        return j if segment == 0 else torch.div(j, self.group_size, rounding_mode="floor")


register(
    Method(
        name="self-extend",
        aliases=("selfextend",),
        params=SelfExtendParams,
        role="remap",
        depends_on_length=False,
        paper="Jin et al. 2024, LLM Maybe LongLM: Self-Extend LLM Context Window Without Tuning (arXiv 2401.01325)",
        summary="Training-free: true positions within the window, floor-grouped positions past it; "
        "reaches (L - W) * G + W tokens.",
    )
)
