"""The figure of a tune: perplexity against length for the best candidates and the unpatched model, and every
candidate's regression inside the trained context beside it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..files import atomic_write
from .figures import legend_labels, line_style

if TYPE_CHECKING:
    from ..reports.runs import PerplexityRow
    from ..reports.tune_report import TuneRow

TOP = 3  # candidates drawn against length


def plot_tune(
    path: Path,
    results: Sequence[PerplexityRow],
    ranked: Sequence[TuneRow],
    *,
    trained_context: int,
    max_regression: float,
    title: str,
) -> None:
    """Write the tune's PNG (atomically).

    Args:
        path (`Path`): the PNG to write.
        results (`Sequence[PerplexityRow]`): the perplexity run's rows, ``none`` among them.
        ranked (`Sequence[TuneRow]`): the candidates, best first.
        trained_context (`int`): ``L``, marked on the length axis.
        max_regression (`float`): the largest regression a winner may have, marked on the bars.
        title (`str`): the figure's title.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.5), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=(3, 2))
    shown = ["none", *[row.method for row in ranked if row.eligible][:TOP]]
    labels = legend_labels(shown)
    for index, method in enumerate(shown):
        points = sorted((r.length, r.ppl) for r in results if r.method == method)
        left.plot([n for n, _ in points], [p for _, p in points], label=labels[method], **line_style(index))
    left.axvline(trained_context, color="gray", linestyle="--", label=f"trained context ({trained_context})")
    from matplotlib.ticker import NullLocator, ScalarFormatter

    lengths = sorted({r.length for r in results})
    left.set(xscale="log", yscale="log", xlabel="length (tokens)", ylabel="perplexity")
    left.set_xticks(lengths, [str(n) for n in lengths])
    left.xaxis.set_minor_locator(NullLocator())
    left.yaxis.set_major_formatter(ScalarFormatter())
    left.yaxis.set_minor_formatter(ScalarFormatter())
    left.legend(fontsize=8)
    names = legend_labels([row.method for row in ranked], width=32)
    bars = right.barh(
        range(len(ranked)),
        [(row.worst_regression - 1) * 100 for row in ranked],
        color=["tab:green" if row.eligible else "tab:gray" for row in ranked],
    )
    right.bar_label(bars, fmt="%+.1f", fontsize=7, padding=2)
    right.set_yticks(range(len(ranked)), [names[row.method] for row in ranked], fontsize=7)
    right.invert_yaxis()
    right.axvline(max_regression * 100, color="tab:red", linestyle=":", label=f"--max-regression {max_regression:.0%}")
    right.set(xlabel="perplexity inside L, against unpatched (%)")
    right.legend(fontsize=8, loc="lower right")
    fig.suptitle(title)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
