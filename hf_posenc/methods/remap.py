"""What the remaps (Self-Extend, Dual Chunk Attention, STRING, ReRoPE) share: attention over *segments*, each a
set of (query, key) pairs whose logits use remapped positions.

Query ``i`` and key ``j <= i`` (token positions) fall in exactly one segment ``g = segment_of(i, j)``; their
logit is ``q(P_g(i)) . k(K_g(j))``, the query rotated to ``P_g(i)`` and the key to ``K_g(j)``, and one
softmax runs over all of a query's keys whatever their segments. RoPE's ``R(a) R(b) = R(a + b)`` lets the
attention backends (:mod:`hf_posenc.attention.extension`) reach those positions by re-rotating the q and k
the model rotated at ``i`` and ``j``. Everything here is pure integer arithmetic on position tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..fields import documented, setting
from ._common import RopeParams

BACKENDS = ("auto", "eager", "blocked", "sdpa", "flex")
TILE_SHAPES = ("full", "lower", "upper")


@dataclass(frozen=True)
class Tiles:
    """``count`` equal rectangles of (query, key) index pairs in a prefill of tokens ``0 .. n-1``: rectangle ``t``
    holds query rows ``query_start + t * rows + a`` and key columns ``key_start + t * rows + b`` for
    ``0 <= a < rows``, ``0 <= b < cols``, and of those the pairs its ``shape`` keeps: ``"full"`` all of them,
    ``"lower"`` ``b <= a`` (a causal square), ``"upper"`` ``b > a`` (a square's strict upper triangle). The shapes
    fused attention kernels run directly, or (``upper``) with rows and columns reversed. Only a single full tile
    may be other than square."""

    shape: str
    query_start: int
    key_start: int
    rows: int
    cols: int
    count: int = 1

    def __post_init__(self) -> None:
        if self.shape not in TILE_SHAPES or min(self.rows, self.cols, self.count) < 1:
            raise ValueError(f"Not a tiling: {self}.")
        if (self.shape != "full" or self.count > 1) and self.rows != self.cols:
            raise ValueError(f"A {self.shape} tile, and each of several, must be square: {self}.")


@documented
@dataclass(frozen=True, kw_only=True)
class RemapParams(RopeParams):
    """What every position remap (Self-Extend, DCA) has: the trained context and the attention backend."""

    SEGMENTS: ClassVar[tuple[str, ...]] = ()
    # Segments whose remapped logits equal the true-position ones (a per-pair shift common to query and key):
    # the backends use the model's q and k there as they are.
    TRUE_DISTANCES: ClassVar[tuple[bool, ...]] = ()
    # For each segment, the segment whose keys it uses as they are turned there: itself, or an earlier one that
    # leaves them where this one wants them (a true-distance segment's keys as the model rotated them, for a segment
    # whose ``key_position`` is ``j``; or both turned to the same ``key_position``). Empty: each its own.
    KEY_SEGMENTS: ClassVar[tuple[int, ...]] = ()
    # How :attr:`reach` is computed, in the method's own symbols (for the messages that quote it).
    REACH_FORMULA: ClassVar[str] = ""

    backend: str = setting(
        "auto",
        help='``"eager"`` (the reference: every segment\'s ``n x n`` logits in float32, one softmax), ``"blocked"``'
        " (query blocks, each against the key range its segments reach: memory linear in the length), "
        '``"sdpa"`` (a prefill without padding as :meth:`tiles`, a few fused causal or full attention calls per'
        " segment merged by log-sum-exp; any other call in the same query blocks, each one "
        '``scaled_dot_product_attention`` call on the segments side by side), ``"flex"`` (``flex_attention`` '
        "with block masks, memory linear: per segment merged by log-sum-exp on CUDA, segments side by side in one"
        ' call on a CPU), or ``"auto"``: flex on CUDA, sdpa elsewhere, decided when patching (a model moved to '
        "CUDA afterwards keeps sdpa).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backend not in BACKENDS:
            raise ValueError(f"Unknown backend {self.backend!r}. Available backends: {', '.join(BACKENDS)}.")

    def segment_of(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """The segment index of each pair (broadcast; meaningful for ``j <= i``)."""
        raise NotImplementedError

    def query_position(self, segment: int, i: torch.Tensor) -> torch.Tensor:
        """``P_g(i)``: where a query at position ``i`` is put in segment ``segment``."""
        raise NotImplementedError

    def key_position(self, segment: int, j: torch.Tensor) -> torch.Tensor:
        """``K_g(j)``: where a key at position ``j`` is put in segment ``segment``."""
        raise NotImplementedError

    def key_source(self, segment: int) -> int:
        """The segment whose turned keys ``segment`` shares (``KEY_SEGMENTS``): the backends turn them once."""
        return self.KEY_SEGMENTS[segment] if self.KEY_SEGMENTS else segment

    @property
    def reach(self) -> int | None:
        """The longest input whose every remapped relative position stays below the trained context ``L``;
        None where there is no such bound (every distance is capped) or ``L`` is not resolved yet."""
        return None

    @property
    def query_scale(self) -> float:
        """What every query is multiplied by, so every logit (1: none; STRING's authors scale q and k)."""
        return 1.0

    def key_span(self, segment: int, first: int, last: int) -> tuple[int, int]:
        """``(lo, hi)``: every key position that queries at ``first .. last`` can see in ``segment`` lies in
        ``lo .. hi`` (inclusive; empty when ``lo > hi``). Lets the query-block backends skip the rest.

        Args:
            segment (`int`): the segment's index in ``SEGMENTS``.
            first (`int`): the smallest query position of the block.
            last (`int`): the largest query position of the block.

        Raises:
            NotImplementedError: here; each remap defines its own.
        """
        raise NotImplementedError

    def tiles(self, segment: int, length: int) -> list[Tiles]:
        """The pairs of ``segment`` in a prefill of ``length`` tokens (positions ``0 .. length-1``) as
        :class:`Tiles`, disjoint and covering exactly the pairs ``j <= i`` with ``segment_of(i, j) == segment``.
        Lets the ``sdpa`` backend run each segment as a few fused causal or full attention calls."""
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class BandRemapParams(RemapParams):
    """A remap of two segments: the band of pairs nearer than :attr:`band` at their true positions, and every farther
    pair in the second segment at the positions the method gives (Self-Extend's window, STRING's shifted offset,
    ReRoPE's window). The band and the rest split the causal triangle the same way whatever the positions."""

    @property
    def band(self) -> int:
        """The band's width: pairs ``i - j < band`` keep their true positions."""
        raise NotImplementedError

    def segment_of(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        return (i - j >= self.band).long()

    def key_span(self, segment: int, first: int, last: int) -> tuple[int, int]:
        if segment == 0:
            return first - self.band + 1, last
        return 0, last - self.band

    def tiles(self, segment: int, length: int) -> list[Tiles]:
        """The rest: the causal square of queries ``B ..`` against keys ``.. n-1-B`` (``j <= i - B``). The band, in
        blocks of ``B`` queries: the causal square on the block's own keys, and on the block before it the keys
        ``j > i - B``, the strict upper triangle of that square. The ``r < B`` rows past the last whole block take
        their own causal square, and of the block before the strict upper triangle of its first ``r`` keys and all
        of its last ``B - r``."""
        band = self.band
        if segment == 1:
            return [Tiles("lower", band, 0, length - band, length - band)] if length > band else []
        blocks, rest = divmod(length, band)
        tiles = [Tiles("lower", 0, 0, band, band, blocks)] if blocks else []
        if blocks > 1 and band > 1:
            tiles.append(Tiles("upper", band, 0, band, band, blocks - 1))
        if rest:
            start = blocks * band
            tiles.append(Tiles("lower", start, start, rest, rest))
            if blocks and rest > 1:
                tiles.append(Tiles("upper", start, start - band, rest, rest))
            if blocks:
                tiles.append(Tiles("full", start, start - band + rest, rest, band - rest))
        return tiles


def remap_distance(params: RemapParams, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """The relative position ``P_g(i) - K_g(j)`` each pair's logit sees (``-1`` where ``j > i``): what the
    tests check against the papers' definitions and what must stay below the trained context.

    Args:
        params (`RemapParams`): the remap, with the trained context resolved.
        i (`torch.Tensor`): query positions, int64.
        j (`torch.Tensor`): key positions, int64, broadcast against ``i`` and on its device.

    Returns:
        `torch.Tensor`: the broadcast shape of ``i`` and ``j`` on ``i``'s device; int64, or float64 for a remap
        with fractional positions (Leaky ReRoPE).
    """
    segment = params.segment_of(i, j)
    distance = torch.full(torch.broadcast_shapes(i.shape, j.shape), -1, dtype=torch.int64, device=i.device)
    for index in range(len(params.SEGMENTS)):
        here = segment == index
        seen = params.query_position(index, i).expand_as(distance) - params.key_position(index, j).expand_as(distance)
        distance = torch.where(here, seen, distance)
    return torch.where(j <= i, distance, -1)
