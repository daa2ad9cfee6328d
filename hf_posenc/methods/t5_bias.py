"""T5's relative position bias (Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified
Text-to-Text Transformer", arXiv 1910.10683, §2.1): a learned scalar per head and relative-distance bucket,
added to the attention logits; one table shared by every layer.

Causal (unidirectional) bucketing of the distance ``n = i - j >= 0`` between query ``i`` and key ``j``: the
first ``num_buckets // 2`` buckets hold ``n = 0, 1, ...`` exactly; the rest cover ``[num_buckets // 2,
max_distance)`` in logarithmically growing ranges, and every ``n >= max_distance`` shares the last bucket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..fields import documented, setting
from ..registry import Method, register
from ._common import positive_int
from .alibi import alibi_slopes

INITS = ("alibi", "zeros")
LONGEST_DISTANCE = 2**22
BACKENDS = ("auto", "eager", "sdpa", "flex")


def t5_buckets(distance: torch.Tensor, *, num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """The bucket of each causal distance ``n = query - key`` (negative distances count as 0).

    ``n < e`` (``e = num_buckets // 2``): bucket ``n``; otherwise ``min(e + floor(ln(n / e) / ln(max_distance / e)
    * (num_buckets - e)), num_buckets - 1)``. The logarithm is taken in float32, as T5's reference code does,
    so the bucket edges agree with it exactly.

    Args:
        distance (`torch.Tensor`): integer distances, any shape.
        num_buckets (`int`, defaults to 32): buckets ``B >= 2``.
        max_distance (`int`, defaults to 128): the distance from which all share the last bucket (``>= B``).

    Returns:
        `torch.Tensor`: int64 buckets in ``[0, num_buckets)``, the shape of ``distance``.
    """
    num_buckets, max_distance = check_bucketing(num_buckets, max_distance)
    n = distance.long().clamp(min=0)
    exact = num_buckets // 2
    scaled = torch.log(n.clamp(min=exact).float() / exact) / math.log(max_distance / exact)  # >= 0 where used
    logarithmic = (exact + (scaled * (num_buckets - exact)).long()).clamp(max=num_buckets - 1)
    return torch.where(n < exact, n, logarithmic)


def check_bucketing(num_buckets: int, max_distance: int) -> tuple[int, int]:
    """``(num_buckets, max_distance)`` checked: ``2 <= num_buckets <= max_distance``."""
    num_buckets = positive_int("num_buckets", num_buckets)
    max_distance = positive_int("max_distance", max_distance)
    if num_buckets < 2:
        raise ValueError(f"num_buckets must be at least 2 (half exact, half log-spaced), got {num_buckets}.")
    if max_distance > LONGEST_DISTANCE:
        raise ValueError(
            f"max_distance must be at most {LONGEST_DISTANCE} (2**22: the alibi init averages every distance up to "
            f"it, and no input is that long), got {max_distance}."
        )
    if max_distance < num_buckets:
        raise ValueError(
            f"max_distance must be at least num_buckets: the first num_buckets // 2 buckets hold one distance each "
            f"and the rest are log-spaced up to max_distance; got max_distance={max_distance} < "
            f"num_buckets={num_buckets}."
        )
    return num_buckets, max_distance


def bucket_distances(num_buckets: int, max_distance: int) -> torch.Tensor:
    """A representative distance per bucket (float64, ``(num_buckets,)``): the mean of the distances
    ``0 .. max_distance`` that fall in it; a bucket none falls in (possible where log-spaced buckets are
    narrower than 1) gets the start of its range, ``e * (max_distance / e)^((b - e) / (B - e))``."""
    num_buckets, max_distance = check_bucketing(num_buckets, max_distance)
    distances = torch.arange(max_distance + 1)
    buckets = t5_buckets(distances, num_buckets=num_buckets, max_distance=max_distance)
    counts = torch.bincount(buckets, minlength=num_buckets).double()
    sums = torch.bincount(buckets, weights=distances.double(), minlength=num_buckets)
    exact = num_buckets // 2
    starts = exact * (max_distance / exact) ** ((torch.arange(num_buckets) - exact) / (num_buckets - exact))
    return torch.where(counts > 0, sums / counts.clamp(min=1), starts.double())


def t5_bias_init(
    num_heads: int, *, num_buckets: int = 32, max_distance: int = 128, init: str = "alibi"
) -> torch.Tensor:
    """The ``(num_buckets, num_heads)`` table a patch starts from (float64).

    ``"alibi"``: ALiBi's bias (Press et al., 2022, arXiv 2108.12409) at each bucket's representative distance
    (:func:`bucket_distances`), ``-m_h * n_b`` with the slopes of :func:`~hf_posenc.methods.alibi.alibi_slopes`:
    training starts from a working recency bias, saturating at ``max_distance`` as T5's buckets do. ``"zeros"``:
    T5's own start (no bias until trained).

    Args:
        num_heads (`int`): the attention heads ``H``.
        num_buckets (`int`, defaults to 32): buckets ``B`` of relative distance (:func:`t5_buckets`).
        max_distance (`int`, defaults to 128): the distance from which all share the last bucket.
        init (`str`, defaults to ``"alibi"``): ``"alibi"`` or ``"zeros"``.

    Raises:
        ValueError: an unknown ``init``, a bucketing :func:`check_bucketing` refuses, or ``num_heads`` not a
            positive integer.
    """
    if init not in INITS:
        raise ValueError(f"Unknown t5-bias init {init!r}. Available inits: {', '.join(INITS)}.")
    if init == "zeros":
        check_bucketing(num_buckets, max_distance)
        return torch.zeros(num_buckets, positive_int("num_heads", num_heads), dtype=torch.float64)
    return -bucket_distances(num_buckets, max_distance)[:, None] * alibi_slopes(num_heads)[None, :]


@documented
@dataclass(frozen=True, kw_only=True)
class T5BiasParams:
    """The T5 relative bias: a learned table over log-spaced distance buckets (Raffel et al. 2020)."""

    num_buckets: int = setting(32, help="buckets of relative distance (T5: 32).")
    max_distance: int = setting(128, help="distances from here on share the last bucket (T5: 128).")
    init: str = setting(
        "alibi",
        help="the table's start, ``\"alibi\"`` (ALiBi's slopes at each bucket's distances: a working bias before any "
        'training) or ``"zeros"`` (T5\'s).',
    )
    backend: str = setting(
        "auto",
        help='``"eager"`` (reference), ``"sdpa"`` (the bias built per call), ``"flex"`` (``flex_attention``, the'
        ' bucket looked up in the score_mod: memory linear in the length; compiled on CUDA) or ``"auto"``: flex'
        " on CUDA, sdpa elsewhere.",
    )

    def __post_init__(self) -> None:
        buckets, distance = check_bucketing(self.num_buckets, self.max_distance)
        object.__setattr__(self, "num_buckets", buckets)
        object.__setattr__(self, "max_distance", distance)
        if self.init not in INITS:
            raise ValueError(f"Unknown t5-bias init {self.init!r}. Available inits: {', '.join(INITS)}.")
        if self.backend not in BACKENDS:
            raise ValueError(f"Unknown t5-bias backend {self.backend!r}. Available backends: {', '.join(BACKENDS)}.")


register(
    Method(
        name="t5-bias",
        aliases=("t5",),
        params=T5BiasParams,
        applies_to=frozenset({"rope", "learned"}),
        role="replace",
        depends_on_length=False,
        adds_parameters=True,
        paper="Raffel et al. 2020, Exploring the Limits of Transfer Learning with a Unified Text-to-Text "
        "Transformer (arXiv 1910.10683), §2.1",
        summary="Replaces RoPE or learned positions by a learned per-head bias per relative-distance bucket, "
        "shared by all layers; needs fine-tuning.",
    )
)
