"""Plots of evaluation results: perplexity against length, passkey accuracy by length and depth.

Used by the evaluation (:mod:`hf_posenc.eval`) and by the Hub layer (the plot a push carries) alike.
Figures are built outside pyplot's global state where possible and written atomically.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..files import atomic_write

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.", ":")
LABEL_WIDTH = 40  # characters of a method's legend label; a longer one is cut with "…"
PANEL_CHARACTERS = 14  # characters of a 9-point title over a heatmap panel's column (1.1 inches)


def plot_ppl_vs_length(path: Path, results: list[dict[str, Any]], *, trained_context: int | None, title: str) -> None:
    """One line per method, perplexity on a log scale against length, the trained context (if known) marked: the
    length axis reaches it where it lies outside the lengths measured. Written atomically as a PNG.

    Args:
        path (`Path`): the PNG to write.
        results (`list[dict]`): result rows with ``method``, ``length`` and ``ppl`` (a results file's
            ``results``); an infinite or NaN perplexity is named at the top edge.
        trained_context (`int` or `None`): the trained context ``L``, marked; None: not known.
        title (`str`): the figure's title.
    """
    fig = ppl_figure(results, trained_context=trained_context, title=title)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))


def ppl_figure(results: list[dict[str, Any]], *, trained_context: int | None, title: str):
    """The figure of :func:`plot_ppl_vs_length` (a `matplotlib.figure.Figure`, outside pyplot).

    Args:
        results (`list[dict]`): result rows with ``method``, ``length`` and ``ppl``.
        trained_context (`int` or `None`): the trained context ``L``, marked; None: not known.
        title (`str`): the figure's title.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import LogLocator, MaxNLocator, NullLocator, ScalarFormatter

    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    labels = legend_labels(list(dict.fromkeys(r["method"] for r in results)))
    for index, (method, label) in enumerate(labels.items()):
        points = sorted((r["length"], r["ppl"]) for r in results if r["method"] == method)
        finite = [(n, ppl) for n, ppl in points if math.isfinite(ppl)]
        (line,) = ax.plot([n for n, _ in finite], [ppl for _, ppl in finite], label=label, **line_style(index))
        for n, ppl in points:  # past float range, or NaN: named at the top edge in the method's colour
            if not math.isfinite(ppl):
                mark, where = "inf" if ppl > 0 else "NaN", (n, 0.98 - 0.05 * index)
                top = ("data", "axes fraction")
                ax.annotate(mark, where, xycoords=top, ha="center", va="top", color=line.get_color())
    if trained_context is not None:
        ax.axvline(trained_context, color="gray", linestyle="--", label=f"trained context ({trained_context})")
    lengths = sorted({r["length"] for r in results})
    shown = [*lengths, *([] if trained_context is None else [trained_context])]  # its line inside the axes
    ax.set_xscale("log", base=2)
    ax.set_xlim(min(shown) / 2**0.2, max(shown) * 2**0.2)  # room for inf / NaN labels; one length works too
    ax.set_xticks(lengths, [length_label(n) for n in lengths])
    ax.minorticks_off()
    values = [r["ppl"] for r in results if math.isfinite(r["ppl"])]
    if values:  # (a log axis with nothing on it cannot be drawn; inf / NaN are named at the top instead)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        if max(values) < 10 * min(values):  # within a decade the log ticks label one or two values
            ax.yaxis.set_major_locator(MaxNLocator(nbins=6))
            ax.yaxis.set_minor_locator(NullLocator())
        else:  # over decades: 1, 2 and 5 of each, not all nine
            ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(2, 5)))
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("perplexity (log scale)" if values else "perplexity")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def compact_spec(spec: str) -> str:
    """``spec`` with lists cut to their length and long decimals to 4 digits (LongRoPE's factors)."""
    spec = re.sub(r"\[[^\]]*\]", lambda match: f"[{len(match.group().split(','))} values]", spec)
    return re.sub(r"\d+\.\d{5,}", lambda match: f"{float(match.group()):.4g}", spec)


def legend_labels(specs: Sequence[str], width: int = LABEL_WIDTH) -> dict[str, str]:
    """Each method spec's legend label: :func:`compact_spec`; where one is longer than ``width``, the parameters
    that every spec of its method shares left out (:func:`_differing`), then cut to ``width`` characters (the last
    one ``…``). Specs whose labels would still read alike are numbered in their order (``#1``, ``#2``, ...)."""
    labels = {spec: compact_spec(spec) for spec in specs}
    if any(len(label) > width for label in labels.values()):
        labels = dict(zip(labels, _differing(list(labels.values())), strict=True))
    labels = {spec: _cut(label, width) for spec, label in labels.items()}
    alike, seen = Counter(labels.values()), Counter()
    for spec, label in labels.items():
        if alike[label] > 1:
            seen[label] += 1
            labels[spec] = f"{label} #{seen[label]}"
    return labels


def _differing(labels: list[str]) -> list[str]:
    """``name:k=v,...`` labels without the ``k=v`` that every label of the same method holds, where a method has two
    or more that differ: ``self-extend:group_size=4,window=1024`` beside ``...group_size=8,window=1024`` is
    ``self-extend:group_size=4``."""
    parts = [(label.partition(":")[0], label.partition(":")[2].split(",")) for label in labels]
    shared: dict[str, set[str]] = {}
    for name, params in parts:
        shared[name] = shared[name] & set(params) if name in shared else set(params)
    counts = Counter(name for name, _ in parts)
    differ = {name for name, params in parts if counts[name] > 1 and set(params) - shared[name]}
    kept = [(name, [p for p in params if name not in differ or p not in shared[name]]) for name, params in parts]
    return [f"{name}:{','.join(params)}" if any(params) else name for name, params in kept]


def _cut(label: str, width: int) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def wrapped(label: str, width: int, lines: int = 3) -> str:
    """``label`` on lines of at most ``width`` characters, broken after its colon and commas where it can, ``lines``
    at most (the last one cut with ``…``); a number :func:`legend_labels` gave (`` #2``) stays at the end.

    Args:
        label (`str`): a legend label (:func:`legend_labels`).
        width (`int`): characters per line.
        lines (`int`, defaults to 3): the most lines.
    """
    body, number = re.fullmatch(r"(.*?)((?: #\d+)?)", label).groups()
    rows: list[str] = []
    for piece in re.findall(r"[^,:]*[,:]?", body)[:-1]:
        if rows and len(rows[-1]) + len(piece) <= width:
            rows[-1] += piece
        else:
            rows.extend(piece[i : i + width] for i in range(0, len(piece), width))
    if len(rows) > lines or rows and len(rows[-1]) + len(number) > width:
        rows = [*rows[: lines - 1], _cut("".join(rows[lines - 1 :]), width - len(number))]
    return "\n".join(rows) + number


def line_style(index: int) -> dict[str, Any]:
    """Marker, line style and sizes of the ``index``-th method: identical curves stay visible, since later
    ones are drawn thinner, with smaller hollow markers of another shape, over the earlier ones."""
    return {
        "marker": MARKERS[index % len(MARKERS)],
        "linestyle": LINESTYLES[(index + index // len(MARKERS)) % len(LINESTYLES)],
        "markersize": max(3.0, 9.0 - 1.5 * index),
        "linewidth": max(1.0, 2.5 - 0.5 * index),
        "markerfacecolor": "none",
    }


def plot_passkey_heatmap(path: Path, grid: list[dict[str, Any]], *, title: str) -> None:
    """One panel per method: accuracy by length (columns) and depth (rows). Written atomically as a PNG.

    Args:
        path (`Path`): the PNG to write.
        grid (`list[dict]`): cells with ``method``, ``length``, ``depth`` (a fraction) and ``accuracy`` (0 to 1).
        title (`str`): the figure's title.
    """
    fig = passkey_figure(grid, title=title)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))


def passkey_figure(grid: list[dict[str, Any]], *, title: str):
    """The figure of :func:`plot_passkey_heatmap` (a `matplotlib.figure.Figure`, outside pyplot). Each panel's
    title is the method's :func:`legend_labels` label, on lines about the panel's width (:func:`wrapped`)."""
    from matplotlib.figure import Figure

    methods = list(dict.fromkeys(cell["method"] for cell in grid))
    lengths = sorted({cell["length"] for cell in grid})
    depths = sorted({cell["depth"] for cell in grid})
    width = max(5.0, 1.5 + 1.1 * len(lengths) * len(methods))
    fig = Figure(figsize=(width, 1.6 + 0.5 * len(depths)), layout="constrained")
    axes = fig.subplots(1, len(methods), squeeze=False, sharey=True)
    titles = legend_labels(methods)
    panel = PANEL_CHARACTERS * len(lengths)
    for ax, method in zip(axes[0], methods, strict=True):
        values = [[float("nan")] * len(lengths) for _ in depths]
        for cell in grid:
            if cell["method"] == method:
                row, col = depths.index(cell["depth"]), lengths.index(cell["length"])
                values[row][col] = cell["accuracy"]
                ax.text(col, row, f"{cell['accuracy']:.0%}", ha="center", va="center", fontsize=8)
        image = ax.imshow(values, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(lengths)), [length_label(n) for n in lengths])
        ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
        ax.set_xlabel("length")
        ax.set_title(wrapped(titles[method], panel), fontsize=9)
    axes[0][0].set_ylabel("depth of the key")
    fig.colorbar(image, ax=axes[0].tolist(), label="accuracy")
    fig.suptitle(title, fontsize=9)
    return fig


def length_label(n: int) -> str:
    """``2048`` -> ``2k``; lengths that are not whole multiples of 1024 as they are."""
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)
