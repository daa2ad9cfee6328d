"""The numbers behind :mod:`hf_posenc.plots.encoding_figures`, computed by the methods' own math
(:mod:`hf_posenc.methods`).

:func:`frequency_data`: what each RoPE scaling does to each rotary pair's frequency. :func:`bias_data`: what each
encoding contributes to the attention score by relative distance (:func:`rope_decay_bound` for RoPE).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..methods import rope_frequencies
from ..methods._common import positive_int, real_number, rope_inv_freq, wavelengths
from ..methods.alibi import alibi_slopes
from ..methods.sinusoidal import sinusoidal_embedding
from ..methods.t5_bias import t5_bias_init, t5_buckets
from ..registry import Method, available_methods, get_method
from ..spec import NONE_METHOD, MethodSpec

FREQUENCY_COLUMNS = ("method", "pair", "wavelength", "wavelength_over_context", "inv_freq", "scaled_inv_freq")
FREQUENCY_COLUMNS += ("scale", "attention_factor", "seq_len")
BIAS_COLUMNS = ("method", "kind", "series", "distance", "value")
BIAS_KINDS = ("alibi", "t5-bias", "sinusoidal", "rope")
UNSCALED_ROPE = "rope"  # in a list of specs: RoPE as trained, like ``none``
DYNAMIC_FACTOR = 4  # a dynamic method without a factor (dynamic-yarn) is drawn at l = 4 L
MAX_DISTANCE = 2**20
MAX_HEAD_DIM = 2**12  # beyond any model's; the bounds keep the figures' memory bounded
MAX_HEADS = 2**10
MAX_WIDTH = 2**16  # num_heads * head_dim, the sinusoidal table's width
CHUNK_VALUES = 2**22  # values computed at once: distances x width


@dataclass(frozen=True)
class Geometry:
    """The model the encodings are drawn for, checked (parameter names in backticks, as the CLI maps them)."""

    head_dim: int
    base: float
    trained_context: int
    seq_len: int | None = None

    def __post_init__(self) -> None:
        if positive_int("`head_dim`", self.head_dim, MAX_HEAD_DIM) % 2:
            raise ValueError(f"`head_dim` (the rotary dimension d) must be even, got {self.head_dim}.")
        if real_number("`base`", self.base) <= 1:
            raise ValueError(f"`base` (RoPE's b in theta_i = b^(-2i/d)) must be > 1, got {self.base!r}.")
        positive_int("`trained_context`", self.trained_context, 2**53)
        if self.seq_len is not None:
            positive_int("`seq_len`", self.seq_len, 2**53)

    def __str__(self) -> str:
        return f"d = {self.head_dim}, base = {self.base:g}, trained context L = {self.trained_context}"


@dataclass(frozen=True)
class _Encoding:
    label: str  # the spec as given
    kind: str  # one of BIAS_KINDS
    rope: Method | None  # the RoPE scaling (None: RoPE as trained, or no RoPE)
    params: dict[str, Any]  # RoPE: its parameters as given; others: all, defaults filled in


def _encodings(specs: Sequence[str], kinds: tuple[str, ...]) -> list[_Encoding]:
    """Every spec parsed (``MethodSpec`` syntax, or ``"rope"``) before anything is computed; ``ValueError`` for
    one whose kind is not in ``kinds``, naming those that are."""
    if isinstance(specs, str) or not specs:
        raise ValueError(f"`specs` must be a list of one or more method specs, got {specs!r}.")
    encodings = []
    for text in specs:
        spec = MethodSpec.parse(NONE_METHOD if text.strip().lower() == UNSCALED_ROPE else text, parameter="specs")
        method = None if spec.unpatched else get_method(spec.method)
        rope = method.part("rope") if method else None
        kind = "rope" if method is None or rope is not None else method.name
        if kind not in kinds:
            scalings = ", ".join(name for name in available_methods() if get_method(name).role == "rope")
            ropes = f"RoPE ('rope' or 'none' as trained; a scaling: {scalings}; or a combination holding one)"
            if kinds == ("rope",):
                raise ValueError(f"`specs` {text!r} does not rescale RoPE's frequencies; this plot draws {ropes}.")
            others = ", ".join(kind for kind in kinds if kind != "rope")
            raise ValueError(
                f"`specs` {text!r} adds nothing by distance to draw; this plot draws {others} and {ropes}."
            )
        params = rope.own(spec.params) if rope else ({} if method is None else spec.defaults)
        encodings.append(_Encoding(text, kind, rope, params))
    return encodings


def _frequencies(encoding: _Encoding, geometry: Geometry) -> tuple[torch.Tensor, float, int | None]:
    """``theta'`` (float64), the attention factor, and the length ``l`` a dynamic method is drawn at (by default
    ``factor * L``)."""
    if encoding.rope is None:
        return rope_inv_freq(geometry.head_dim, geometry.base), 1.0, None
    params, context = dict(encoding.params), geometry.trained_context
    if params.pop("original_max_position_embeddings", context) != context:
        raise ValueError(
            f"`specs` {encoding.label!r} sets original_max_position_embeddings, and the plot's `trained_context` is "
            f"{context}; give the trained context once, as `trained_context`."
        )
    length = None
    if encoding.rope.dynamic:
        length = geometry.seq_len or round(params.get("factor", DYNAMIC_FACTOR) * context)
    inv_freq, attention = rope_frequencies(
        encoding.rope.name,
        head_dim=geometry.head_dim,
        base=geometry.base,
        original_max_position_embeddings=context,
        seq_len=length,
        **params,
    )
    return inv_freq, attention, length


def frequency_data(
    specs: Sequence[str], *, head_dim: int, base: float, trained_context: int, seq_len: int | None = None
) -> list[dict[str, Any]]:
    """What each RoPE scaling does to each rotary pair: one row per method and pair.

    Args:
        specs (`Sequence[str]`): RoPE method specs (``yarn:factor=4``, a combination ``yarn+logn``, or ``rope`` /
            ``none``: as trained); another method is a ``ValueError`` naming the RoPE ones.
        head_dim (`int`): the rotary dimension ``d``.
        base (`float`): the RoPE base ``b``.
        trained_context (`int`): ``L``.
        seq_len (`int`, *optional*): the length ``l`` dynamic methods are drawn at; defaults to ``factor * L``.

    Returns:
        `list[dict]`: keys :data:`FREQUENCY_COLUMNS`: ``method`` (the spec as given), ``pair`` (``i``),
        ``wavelength`` (``lambda_i = 2 pi / theta_i``, unscaled), ``wavelength_over_context`` (``lambda_i / L``, the
        plot's x), ``inv_freq`` (``theta_i = b^(-2i/d)``, RoFormer Eq. 15), ``scaled_inv_freq`` (``theta_i'``, what
        ``patch`` applies), ``scale`` (``theta_i / theta_i'``, the plot's y: 1 kept, ``s`` interpolated as PI),
        ``attention_factor`` (multiplying cos and sin) and ``seq_len`` (``l``; None for static methods).
    """
    geometry = Geometry(head_dim, base, trained_context, seq_len)
    theta = rope_inv_freq(head_dim, base)
    wavelength = wavelengths(theta)
    rows = []
    for encoding in _encodings(specs, ("rope",)):
        scaled, attention, length = _frequencies(encoding, geometry)
        columns = torch.stack([wavelength, wavelength / trained_context, theta, scaled, theta / scaled], -1).tolist()
        for pair, values in enumerate(columns):  # in the order of FREQUENCY_COLUMNS
            rows.append(dict(zip(FREQUENCY_COLUMNS, [encoding.label, pair, *values, attention, length], strict=True)))
    return rows


def rope_decay_bound(inv_freq: torch.Tensor, distances: torch.Tensor) -> torch.Tensor:
    """RoFormer (Su et al. 2021, arXiv 2104.09864) §3.4.3: the relative upper bound of RoPE's score at relative
    distance ``n``, ``(1 / (d/2)) sum_{j=1}^{d/2} |S_j|`` with ``S_j = sum_{k=0}^{j-1} e^{i n theta_k}``.

    Args:
        inv_freq (`torch.Tensor`): ``theta_k``, ``d/2`` values (a scaling's ``theta_k'``).
        distances (`torch.Tensor`): the distances ``n``, 1-D.

    Returns:
        `torch.Tensor`: float64, one bound per distance.
    """
    theta = inv_freq.to(torch.float64)

    def bound(n: torch.Tensor) -> torch.Tensor:
        angles = n.to(torch.float64)[:, None] * theta  # (chunk, d/2)
        return torch.polar(torch.ones_like(angles), angles).cumsum(-1).abs().mean(-1)

    return _chunked(bound, distances, len(theta))


def _chunked(fn: Callable[[torch.Tensor], torch.Tensor], distances: torch.Tensor, width: int) -> torch.Tensor:
    """``fn`` over ``distances`` a chunk at a time: ``width`` values per distance, at most CHUNK_VALUES at once."""
    return torch.cat([fn(part) for part in distances.split(max(1, CHUNK_VALUES // width))])


@dataclass(frozen=True)
class TrainedT5Table:
    """A saved model's trained T5 bias table, ``(num_buckets, heads)``, with the bucketing it was trained with."""

    table: torch.Tensor
    num_buckets: int
    max_distance: int


@dataclass(frozen=True)
class BiasCurve:
    """One line of the bias figure: ``values[n]`` for ``n = 0 .. N`` (float64)."""

    method: str
    kind: str
    series: str
    values: torch.Tensor


def _bias_curves(
    encoding: _Encoding, distances: torch.Tensor, num_heads: int, geometry: Geometry, t5_table: TrainedT5Table | None
) -> list[BiasCurve]:
    def curve(series: str, values: torch.Tensor) -> BiasCurve:
        return BiasCurve(encoding.label, encoding.kind, series, values)

    def heads(count: int) -> list[int]:  # first, middle, last
        return sorted({0, count // 2, count - 1})

    params = encoding.params
    if encoding.kind == "alibi":
        given = params["slopes"]
        slopes = alibi_slopes(num_heads) if given is None else torch.tensor(given, dtype=torch.float64)
        return [curve(f"head {h + 1} (m = {slopes[h]:.3g})", 0.0 - slopes[h] * distances) for h in heads(len(slopes))]
    if encoding.kind == "t5-bias":
        buckets = dict(num_buckets=params["num_buckets"], max_distance=params["max_distance"])
        bucket = t5_buckets(distances, **buckets)
        if t5_table is not None and (t5_table.num_buckets, t5_table.max_distance) == tuple(buckets.values()):
            trained = t5_table.table.to(torch.float64)
            return [curve(f"head {h + 1}, trained", trained[bucket, h]) for h in heads(trained.shape[1])]
        table = t5_bias_init(num_heads, init=params["init"], **buckets)
        return [curve(f"head {h + 1}, init={params['init']}", table[bucket, h]) for h in heads(num_heads)]
    if encoding.kind == "sinusoidal":
        dim, base, scale = num_heads * geometry.head_dim, params["base"], params["scale"] or 1.0
        origin = sinusoidal_embedding(torch.zeros(()), dim, base=base)
        product = _chunked(lambda n: sinusoidal_embedding(n, dim, base=base) @ origin, distances, dim)
        return [curve(f"d = {dim}", product * scale**2 / (dim / 2))]
    inv_freq, _, length = _frequencies(encoding, geometry)
    at = "" if length is None else f" at l = {length} = {length / geometry.trained_context:g} L"
    return [curve(f"bound{at}", rope_decay_bound(inv_freq, distances))]


def bias_data(
    specs: Sequence[str],
    *,
    max_distance_shown: int,
    num_heads: int,
    head_dim: int,
    base: float,
    trained_context: int,
    seq_len: int | None = None,
    t5_table: TrainedT5Table | None = None,
) -> list[BiasCurve]:
    """The score contribution of each encoding at the relative distances ``n = 0 .. max_distance_shown``.

    ALiBi: ``-m_h n`` (its ``slopes``, else :func:`alibi_slopes` of ``num_heads``) for the first, middle and last
    head. T5: :func:`t5_bias_init` (the table at the start of training, its ``init``) at :func:`t5_buckets`, same
    heads; or ``t5_table``, a saved model's trained table, for the T5 specs of its bucketing (``num_buckets`` and
    ``max_distance``). Sinusoidal: ``PE(0)·PE(n) / (d/2)`` (times ``scale^2`` when given) for the model width
    ``d = num_heads * head_dim``; it equals ``PE(p)·PE(p+n) / (d/2) = mean_i cos(n w_i)`` for every ``p``. RoPE
    (``rope``, ``none``, a scaling): :func:`rope_decay_bound` of its ``theta'``, a dynamic one at ``seq_len``
    (default ``factor * L``).

    Args:
        specs (`Sequence[str]`): ALiBi, T5-bias, sinusoidal and RoPE specs (``rope`` or ``none``: as trained; a
            scaling, or a combination holding one); another method is a ``ValueError`` naming those it draws.
        max_distance_shown (`int`): the largest distance ``n``, at most 2^20.
        num_heads (`int`): attention heads, at most 2^10.
        head_dim (`int`): the head (rotary) dimension ``d``, even, at most 2^12; ``num_heads * head_dim`` at most
            2^16.
        base (`float`): the RoPE base ``b``, > 1.
        trained_context (`int`): the trained context ``L``.
        seq_len (`int`, *optional*): the length ``l`` dynamic methods are drawn at.
        t5_table (`TrainedT5Table`, *optional*): a saved model's trained T5 table.

    Returns:
        `list[BiasCurve]`: the curves, each ``values[n]`` for ``n = 0 .. max_distance_shown``, in the order of
        ``specs``.

    Raises:
        ValueError: a spec it does not draw or cannot parse, or a number out of its range.
        TypeError: ``base`` is not a number.
    """
    geometry = Geometry(head_dim, base, trained_context, seq_len)
    positive_int("`num_heads`", num_heads, MAX_HEADS)
    if num_heads * head_dim > MAX_WIDTH:
        raise ValueError(
            f"`num_heads` x `head_dim` (the width of the sinusoidal table) must be at most {MAX_WIDTH}, got "
            f"{num_heads} x {head_dim}."
        )
    distances = torch.arange(positive_int("`max_distance_shown`", max_distance_shown, MAX_DISTANCE) + 1)
    encodings = _encodings(specs, BIAS_KINDS)
    return [curve for each in encodings for curve in _bias_curves(each, distances, num_heads, geometry, t5_table)]
