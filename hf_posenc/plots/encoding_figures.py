"""Plots of what each position encoding does, from the numbers of :mod:`hf_posenc.plots.encoding_data`.

* ``frequencies``: for each RoPE scaling, the factor ``theta_i / theta_i'`` by which it divides the frequency of
  each rotary pair ``i``, against the pair's unscaled wavelength over the trained context, ``lambda_i / L`` (the
  view of the YaRN paper, arXiv 2309.00071, §3.2, where ``r = L / lambda``). ``frequencies.csv``: one row per
  method and pair, columns :data:`FREQUENCY_COLUMNS` (see :func:`frequency_data`).
* ``bias``: what each encoding contributes to the attention score against the relative distance ``n``, one panel
  per kind (:data:`BIAS_PANELS`). ``bias.csv``: one row per curve and distance, columns :data:`BIAS_COLUMNS`.

``*_figure`` draws (a matplotlib ``Figure`` outside pyplot), ``write_*_plot`` computes, draws and writes both.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..architectures import rotary_dim
from ..files import atomic_write
from ..record import PatchRecord
from ..registry import get_method
from ..spec import format_method_spec
from .encoding_data import (
    BIAS_COLUMNS,
    BIAS_KINDS,
    FREQUENCY_COLUMNS,
    BiasCurve,
    Geometry,
    TrainedT5Table,
    bias_data,
    frequency_data,
)
from .figures import compact_spec, line_style

FREQUENCY_PLOT, FREQUENCY_CSV, BIAS_PLOT, BIAS_CSV = "frequencies.png", "frequencies.csv", "bias.png", "bias.csv"
BIAS_PANELS = dict(  # kind -> panel title, in panel order
    zip(
        BIAS_KINDS,
        (
            "ALiBi: -m_h n added to the logit (Press et al. 2022)",
            "T5 bias: the table (its start, or trained) by bucket (Raffel et al. 2020 §2.1)",
            "sinusoidal: PE(p)·PE(p+n) / (d/2), the same for every p (Vaswani et al. 2017 §3.5)",
            "RoPE: relative upper bound (1/(d/2)) Σ_j |S_j| (RoFormer §3.4.3)",
        ),
        strict=True,
    )
)
STEPS = {"t5-bias": "steps-post"}  # one value per bucket: a step function


def frequency_figure(rows: list[dict[str, Any]], *, trained_context: int, title: str) -> Any:
    """``theta_i / theta_i'`` (log2) against ``lambda_i / L`` (log), one line per method, ``lambda = L`` marked.

    Args:
        rows (`list[dict]`): :func:`~hf_posenc.plots.encoding_data.frequency_data`'s rows.
        trained_context (`int`): the trained context ``L``.
        title (`str`): the figure's title.

    Returns:
        `matplotlib.figure.Figure`: the figure, outside pyplot.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 5))
    ax = fig.subplots()
    for index, method in enumerate(dict.fromkeys(row["method"] for row in rows)):
        mine = [row for row in rows if row["method"] == method]
        attention = mine[0]["attention_factor"]
        label = compact_spec(method) + ("" if attention == 1 else f" (attention ×{attention:.4g})")
        if mine[0]["seq_len"] is not None:
            label += f" at l = {mine[0]['seq_len']} = {mine[0]['seq_len'] / trained_context:g} L"
        x, y = [row["wavelength_over_context"] for row in mine], [row["scale"] for row in mine]
        ax.plot(x, y, label=label, **line_style(index))
    ax.axvline(1.0, color="gray", linestyle="--", label=f"λ = L = {trained_context}")
    ax.set_xscale("log")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("unscaled wavelength over the trained context, λ_i / L   (λ_i = 2π / θ_i; a point per pair)")
    ax.set_ylabel("θ_i / θ_i'   (1: kept; s: interpolated as PI)")
    return _finish(fig, [ax], title, outside=True)


def bias_figure(curves: list[BiasCurve], *, trained_context: int, title: str) -> Any:
    """One panel per kind, distance on a log axis from 1 (the CSV has ``n = 0`` too), ``L`` marked for RoPE.

    Args:
        curves (`list[BiasCurve]`): :func:`~hf_posenc.plots.encoding_data.bias_data`'s curves.
        trained_context (`int`): the trained context ``L``, marked where the distances reach it.
        title (`str`): the figure's title.

    Returns:
        `matplotlib.figure.Figure`: the figure, outside pyplot.
    """
    from matplotlib.figure import Figure

    kinds = [kind for kind in BIAS_PANELS if any(curve.kind == kind for curve in curves)]
    columns = min(2, len(kinds))
    fig = Figure(figsize=(6.5 * columns, 4.2 * -(-len(kinds) // columns)))
    axes = fig.subplots(-(-len(kinds) // columns), columns, squeeze=False).flatten()
    for ax, kind in zip(axes, kinds, strict=False):
        for index, curve in enumerate(curve for curve in curves if curve.kind == kind):
            n = torch.arange(1, len(curve.values))
            marks = (torch.logspace(0, math.log10(len(n)), 12).long().unique() - 1).tolist()  # even on the log axis
            style = {
                **line_style(index),
                "linewidth": 1.0,
                "markevery": marks,
                "drawstyle": STEPS.get(kind, "default"),
            }
            ax.plot(n, curve.values[1:], label=f"{compact_spec(curve.method)}: {curve.series}", **style)
        if kind == "rope" and trained_context < len(curves[0].values):
            ax.axvline(trained_context, color="gray", linestyle="--", label=f"trained context L = {trained_context}")
        ax.set_xscale("log")
        ax.set_xlabel("relative distance n (tokens)")
        ax.set_title(BIAS_PANELS[kind], fontsize=8)
    for ax in axes[len(kinds) :]:
        ax.set_visible(False)
    return _finish(fig, axes[: len(kinds)], title)


def _finish(fig: Any, axes: Sequence[Any], title: str, outside: bool = False) -> Any:
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, **({"loc": "upper left", "bbox_to_anchor": (1.01, 1)} if outside else {}))
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def write_frequency_plot(
    output_dir: str | Path,
    specs: Sequence[str],
    *,
    head_dim: int,
    base: float,
    trained_context: int,
    seq_len: int | None = None,
) -> tuple[Path, Path]:
    """Write ``frequencies.png`` and ``frequencies.csv`` (:func:`frequency_data`, the plotted numbers) into
    ``output_dir``, each atomically, once all is computed (bad input writes nothing).

    Args:
        output_dir (`str` or `Path`): the folder written into.
        specs (`Sequence[str]`): RoPE method specs, as :func:`frequency_data` takes them.
        head_dim (`int`): the rotary dimension ``d``.
        base (`float`): the RoPE base ``b``.
        trained_context (`int`): the trained context ``L``.
        seq_len (`int`, *optional*): the length ``l`` dynamic methods are drawn at; defaults to ``factor * L``.

    Returns:
        `tuple[Path, Path]`: the PNG and the CSV.

    Raises:
        ValueError: a spec or a number :func:`frequency_data` refuses, or a name in ``output_dir`` taken by
            something other than a file.
    """
    rows = frequency_data(specs, head_dim=head_dim, base=base, trained_context=trained_context, seq_len=seq_len)
    title = f"How RoPE scalings divide each pair's frequency: {Geometry(head_dim, base, trained_context)}"
    fig = frequency_figure(rows, trained_context=trained_context, title=title)
    table = ([row[key] for key in FREQUENCY_COLUMNS] for row in rows)
    return _write(Path(output_dir), FREQUENCY_PLOT, fig, FREQUENCY_CSV, FREQUENCY_COLUMNS, table)


def write_bias_plot(
    output_dir: str | Path,
    specs: Sequence[str],
    *,
    max_distance_shown: int,
    num_heads: int,
    head_dim: int,
    base: float,
    trained_context: int,
    seq_len: int | None = None,
    t5_table: TrainedT5Table | None = None,
) -> tuple[Path, Path]:
    """Write ``bias.png`` and ``bias.csv`` (:func:`bias_data`: ``method``, ``kind``, ``series``, ``distance`` ``n``
    and ``value``, a row per curve and distance) into ``output_dir``, each atomically, once all is computed.

    Args:
        output_dir (`str` or `Path`): the folder written into.
        specs (`Sequence[str]`): method specs, as :func:`bias_data` takes them.
        max_distance_shown (`int`): the largest distance ``n`` drawn.
        num_heads (`int`): attention heads.
        head_dim (`int`): the head (rotary) dimension ``d``.
        base (`float`): the RoPE base ``b``.
        trained_context (`int`): the trained context ``L``.
        seq_len (`int`, *optional*): the length ``l`` dynamic methods are drawn at; defaults to ``factor * L``.
        t5_table (`TrainedT5Table`, *optional*): a saved model's trained T5 table, drawn for the T5 specs of its
            bucketing.

    Returns:
        `tuple[Path, Path]`: the PNG and the CSV.

    Raises:
        ValueError: a spec or a number :func:`bias_data` refuses, or a name in ``output_dir`` taken by something
            other than a file.
    """
    geometry = dict(head_dim=head_dim, base=base, trained_context=trained_context)
    shown = dict(max_distance_shown=max_distance_shown, num_heads=num_heads, seq_len=seq_len, t5_table=t5_table)
    curves = bias_data(specs, **shown, **geometry)
    title = f"What each encoding adds to the attention score by distance: {num_heads} heads, {Geometry(**geometry)}"
    fig = bias_figure(curves, trained_context=trained_context, title=title)
    table = ((c.method, c.kind, c.series, n, value) for c in curves for n, value in enumerate(c.values.tolist()))
    return _write(Path(output_dir), BIAS_PLOT, fig, BIAS_CSV, BIAS_COLUMNS, table)


def _write(
    folder: Path, plot_name: str, fig: Any, data_name: str, columns: Sequence[str], rows: Any
) -> tuple[Path, Path]:
    """Write the figure and the CSV of its numbers (``columns``, then ``rows``) into ``folder``; neither when one
    of the two names is taken by something other than a file (a folder): the plot would stand without its numbers."""
    for path in (folder / plot_name, folder / data_name):
        if path.exists() and not path.is_file():
            raise ValueError(f"{path} is not a file it can replace (a folder?); choose another `output` folder.")

    def write_csv(tmp: Path) -> None:
        with tmp.open("w", newline="", encoding="utf-8") as file:
            csv.writer(file).writerows([columns, *rows])

    _write_png(folder / plot_name, fig)
    atomic_write(folder / data_name, write_csv)
    return folder / plot_name, folder / data_name


def _write_png(path: Path, fig: Any) -> None:
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))


def patch_plot_file(record: PatchRecord) -> str | None:
    """The encoding plot a push of a model patched with ``record`` carries (:mod:`hf_posenc.hub.push`):
    :data:`FREQUENCY_PLOT` for a RoPE scaling, alone or in a combination; None for the rest (ALiBi, T5, NoPE and
    sinusoidal replace RoPE; remaps and log-n leave its frequencies as trained; GPT-2's ``pi`` resamples a
    learned table, baked into the weights)."""
    return FREQUENCY_PLOT if get_method(record.method).part("rope") and not record.baked else None


def write_patch_plot(path: Path, config: Any) -> None:
    """Draw the :func:`patch_plot_file` plot of a patched model's ``config``: its RoPE scaling on its rotary
    dimension, base and trained context, labelled with the parameters that differ from the method's defaults."""
    record = PatchRecord.from_config(config)
    rope = get_method(record.method).part("rope")
    params = rope.own(record.params)
    context = params.pop("original_max_position_embeddings")
    defaults = {item.name: item.default for item in dataclasses.fields(rope.params)}
    spec = format_method_spec(rope.name, {key: value for key, value in params.items() if defaults.get(key) != value})
    base = (record.base.get("rope_parameters") or config.rope_parameters)["rope_theta"]
    geometry = Geometry(rotary_dim(config), base, context)
    rows = frequency_data([spec], **dataclasses.asdict(geometry))
    title = f"{record.method}: θ_i / θ_i' by pair, {geometry}"
    _write_png(path, frequency_figure(rows, trained_context=context, title=title))
