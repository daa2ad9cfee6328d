"""ALiBi (Press, Smith, Lewis 2022, "Train Short, Test Long", arXiv 2108.12409): no position embedding;
the logit of query ``i`` and key ``j <= i`` gets ``-m_h * (i - j)``, one fixed slope ``m_h`` per head."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..fields import documented, setting
from ..registry import Method, register
from ._common import positive_int, real_number

BACKENDS = ("auto", "eager", "sdpa", "flex", "cudnn")


def alibi_slopes(num_heads: int, *, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The paper's head slopes (§3 and its reference code), for any number of heads.

    For ``n`` a power of two, ``m_h = 2^(-8h/n)``, ``h = 1 .. n``: a geometric sequence starting at, and with
    ratio, ``2^(-8/n)``. Otherwise, with ``c`` the largest power of two below ``n``: the slopes for ``c``
    heads followed by the first ``n - c`` of the slopes for ``2c`` heads taken at even indices.

    Args:
        num_heads (`int`): number of (query) heads ``n`` >= 1.
        dtype (`torch.dtype`, defaults to float64): dtype of the result.

    Returns:
        `torch.Tensor`: ``(num_heads,)`` slopes; decreasing for a power of two (otherwise the appended
        ``n - c`` slopes interleave: for 6 heads ``1/4, 1/16, 1/64, 1/256, 1/2, 1/8``).
    """
    num_heads = positive_int("num_heads", num_heads)  # numpy integers too
    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = _power_of_two_slopes(closest)
    if closest != num_heads:
        slopes = torch.cat([slopes, _power_of_two_slopes(2 * closest)[0::2][: num_heads - closest]])
    return slopes.to(dtype)


def are_paper_slopes(slopes: torch.Tensor | tuple[float, ...]) -> bool:
    """Whether ``slopes`` are :func:`alibi_slopes` for their count (to float32 precision)."""
    slopes = torch.as_tensor(slopes, dtype=torch.float32).cpu()
    return torch.allclose(slopes, alibi_slopes(len(slopes), dtype=torch.float32), rtol=1e-6, atol=0)


def _power_of_two_slopes(n: int) -> torch.Tensor:
    exponents = torch.arange(1, n + 1, dtype=torch.float64)  # h = 1 .. n
    return 2.0 ** (-8.0 * exponents / n)


@documented
@dataclass(frozen=True, kw_only=True)
class AlibiParams:
    """ALiBi: a linear bias of the distance, one slope per head (Press et al. 2022)."""

    backend: str = setting(
        "auto",
        help='attention backend: ``"eager"`` (reference), ``"sdpa"`` (a bias built per call; fine on CPU), '
        '``"flex"`` (``flex_attention`` with a score_mod: memory linear in the sequence length; compiled on '
        'CUDA), ``"cudnn"`` (CUDA, the ``cudnn`` extra: cuDNN\'s fused ALiBi kernel for causal prefills without '
        'padding, flex for the other calls; the paper\'s slopes only), or ``"auto"``: cudnn on CUDA where its '
        "check on the GPU passes, else flex; sdpa off CUDA.",
    )
    slopes: tuple[float, ...] | None = setting(
        None,
        help="one slope per query head; ``patch`` fills in the paper's (:func:`alibi_slopes`).",
    )

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"Unknown ALiBi backend {self.backend!r}. Available backends: {', '.join(BACKENDS)}.")
        if self.slopes is not None:
            if isinstance(self.slopes, (str, bytes)) or not hasattr(self.slopes, "__iter__"):
                raise TypeError(f"slopes must be a list of numbers (one per query head), got {self.slopes!r}.")
            slopes = tuple(real_number(f"slopes[{i}]", slope) for i, slope in enumerate(self.slopes))
            as_float32 = torch.tensor(slopes, dtype=torch.float32)
            if not slopes or not bool((as_float32.isfinite() & (as_float32 > 0)).all()):
                raise ValueError(
                    f"ALiBi slopes must be finite and > 0 in float32 (the bias -m (i - j) is computed in it), "
                    f"got {self.slopes!r}."
                )
            object.__setattr__(self, "slopes", slopes)


def paper_slopes_filled_in(name: str, value: object) -> bool:
    """Whether a recorded ALiBi parameter is what ``patch`` fills in: the paper's slopes for the model's heads."""
    return name == "slopes" and value is not None and are_paper_slopes(value)


register(
    Method(
        name="alibi",
        params=AlibiParams,
        applies_to=frozenset({"rope", "learned"}),
        role="replace",
        depends_on_length=False,
        filled_in=paper_slopes_filled_in,
        paper="Press, Smith, Lewis 2022, Train Short, Test Long: Attention with Linear Biases (arXiv 2108.12409)",
        summary="Replaces RoPE or learned positions by linear attention biases; a RoPE- or wpe-trained model "
        "needs fine-tuning to work well with it.",
    )
)
