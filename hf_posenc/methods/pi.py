"""Position Interpolation (Chen et al. 2023, arXiv 2306.15595): positions squeezed by ``s``.

For RoPE the frequencies are divided by ``s``; for a learned table (GPT-2) the table is resampled to
``s`` times as many rows (:func:`interpolate_positions`)."""

from __future__ import annotations

import torch

from ..registry import Method, register
from ._common import ScaledRopeParams, rope_inv_freq, scale_factor

# The largest resampled position table (1 GiB in its dtype: GPT-2 small's 768 float32 columns, 349,525 rows,
# factor 341 on 1024 trained positions); computing it needs about four times that in float64 besides.
MAX_TABLE_BYTES = 2**30


def pi_frequencies(
    params: ScaledRopeParams,
    *,
    head_dim: int,
    base: float,
    seq_len: int | None = None,
    dtype=torch.float64,
    device=None,
) -> tuple[torch.Tensor, float]:
    """Position Interpolation (Chen et al., 2023, arXiv 2306.15595), eq. 4: ``f'(x, m) = f(x, m L / L')``, i.e.
    ``theta_i' = theta_i / s`` for every pair.

    Args:
        params (`ScaledRopeParams`): ``factor``, ``s = L'/L``.
        head_dim (`int`): the rotary dimension ``d``.
        base (`float`): the RoPE base ``b`` (``rope_theta``).
        seq_len (`int`, *optional*): not read (PI is static); part of the methods' ``frequencies`` signature.
        dtype (`torch.dtype`, defaults to float64): dtype of the returned ``inv_freq``.
        device (`torch.device` or `str`, *optional*): where ``inv_freq`` is made.

    Returns:
        `tuple[torch.Tensor, float]`: ``theta_i'`` (``d // 2`` values) and the attention factor, 1.

    Raises:
        ValueError: ``head_dim`` or ``base`` out of range (:func:`~hf_posenc.methods._common.rope_inv_freq`).
    """
    return (rope_inv_freq(head_dim, base, device=device) / params.factor).to(dtype), 1.0


def pi_transformers_rope(params: ScaledRopeParams, head_dim: int, base: float) -> dict:
    return {"rope_type": "linear", "factor": params.factor}


register(
    Method(
        name="pi",
        aliases=("linear", "position-interpolation"),
        params=ScaledRopeParams,
        frequencies=pi_frequencies,
        transformers_rope=pi_transformers_rope,
        applies_to=frozenset({"rope", "learned"}),
        depends_on_length=False,
        paper="Chen et al. 2023, Extending Context Window of LLMs via Position Interpolation (arXiv 2306.15595)",
        summary="Needs a short fine-tune (1000 steps in the paper); without one it hurts at every length. "
        "GPT-2: resamples wpe to factor x n_positions rows.",
    )
)


def interpolate_positions(table: torch.Tensor, factor: float) -> torch.Tensor:
    """PI for a learned absolute table (GPT-2 ``wpe``): ``round(s * L)`` rows, row ``p'`` read at ``p' / s``.

    The paper's ``f'(x, m) = f(x, m L / L')`` applied to a table: linear interpolation between the two
    nearest trained rows (so row ``s * k`` is trained row ``k`` for integer ``s``); past the last trained
    row, where ``p' / s > L - 1``, that row is repeated. Computed in float64, returned in the table's dtype.

    Args:
        table (`torch.Tensor`): ``(L, D)`` trained position embeddings.
        factor (`float`): ``s = L'/L`` >= 1.
    """
    factor = scale_factor(factor)
    rows, new_rows = table.shape[0], round(factor * table.shape[0])
    _check_table_size(new_rows, table, factor)
    source = torch.arange(new_rows, dtype=torch.float64, device=table.device) / factor  # (L',)
    low = source.floor().long().clamp(max=rows - 1)
    high = (low + 1).clamp(max=rows - 1)
    weight = (source - low).clamp(max=1.0)[:, None]  # (L', 1)
    trained = table.double()
    # in place on the gathered copies: two (L', D) float64 tensors at a time
    return trained[low].mul_(1 - weight).add_(trained[high].mul_(weight)).to(table.dtype)  # (L', D)


def _check_table_size(new_rows: int, table: torch.Tensor, factor: float) -> None:
    """Refuse, before allocating, a resampled table over ``MAX_TABLE_BYTES`` in the table's dtype."""
    rows, width = table.shape
    size = new_rows * width * table.element_size()
    if size > MAX_TABLE_BYTES:
        most = MAX_TABLE_BYTES // (width * table.element_size())
        raise ValueError(
            f"factor={factor!r} would resample the position table from {rows} to {new_rows:,} rows of {width} "
            f"({size / 2**30:.6g} GiB in {str(table.dtype).removeprefix('torch.')}); hf_posenc builds tables of at "
            f"most 1 GiB: {most:,} rows here, factor <= {most / rows:.4g}."
        )
