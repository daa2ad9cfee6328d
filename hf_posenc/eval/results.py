"""Results files: JSON (the record), CSV, plots, the console table, and resuming a killed run.

Every file is written to a temporary file in the same folder and moved into place with
:func:`os.replace`, so a run killed at any moment leaves either the previous or the new version.
A results file remembers the arguments that define its numbers (``"arguments"``); a run with other
arguments refuses the folder instead of mixing or overwriting results.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import platform
import shutil
import tempfile
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.", ":")
CSV_FIELDS = ("method", "length", "ppl", "nll", "tokens", "windows", "skipped_documents", "dropped_tokens", "seconds")


def versions() -> dict[str, str]:
    """Versions of the packages that decide the numbers, and the Python and platform."""
    import accelerate
    import datasets
    import torch
    import transformers

    import hf_posenc

    return {
        "hf_posenc": hf_posenc.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "datasets": datasets.__version__,
        "python": platform.python_version(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def device_description(device: Any) -> str:
    """The accelerator's name (``NVIDIA H100 80GB HBM3``), or the CPU's model and thread count: last digits of
    the numbers, and all timings, depend on it."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")  # Linux
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    name = names[0] if names else platform.processor() or platform.machine()
    return f"{name} ({torch.get_num_threads()} threads)"


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then move it onto ``path``. A file replaced
    keeps its permissions (results someone restricted stay restricted)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{uuid.uuid4().hex}{path.suffix}")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # mode 0666 & ~umask, as a new file gets
    try:
        if path.exists():
            shutil.copymode(path, tmp)
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def check_output(folder: Path) -> None:
    """Raise ``ValueError`` unless results can be written to ``folder``: a writable folder, or one that can
    be created. A temporary folder is made and removed to check (permissions alone mislead root)."""
    existing = next(path for path in (folder, *folder.parents) if path.exists())
    if not existing.is_dir():
        raise ValueError(f"Cannot write results to {folder}: {existing} is a file. Choose another --output.")
    try:
        os.rmdir(tempfile.mkdtemp(dir=existing, prefix=".hf-posenc-check-"))
    except OSError as error:
        place = "" if existing == folder else f" (cannot create a folder in {existing})"
        raise ValueError(
            f"Cannot write results to {folder}{place}: {error.strerror}. Choose another --output."
        ) from None


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def load_previous(path: Path, arguments: dict[str, Any]) -> dict[str, Any] | None:
    """The record already in ``path`` for the same ``arguments``; None if there is no file.

    Raises:
        `ValueError`: the file is not a results file, or holds results of other arguments (it is left
            untouched either way).
    """
    if not path.exists():
        return None
    previous = _read_record(path)
    if previous.get("arguments") != arguments:
        changed = sorted(
            key
            for key in set(arguments) | set(previous.get("arguments", {}))
            if arguments.get(key) != previous.get("arguments", {}).get(key)
        )
        raise ValueError(
            f"{path} holds results of different arguments (differing: {', '.join(changed)}); "
            "choose another --output folder or rerun with the same arguments to resume."
        )
    return previous


def _read_record(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; ``ValueError`` naming the file if it holds none."""
    advice = "move it away or choose another --output folder"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not a results file (not JSON: {error}); {advice}.") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path} is not a results file (a JSON {type(record).__name__}, not an object); {advice}.")
    return record


def sort_results(results: list[dict[str, Any]], methods: list[str]) -> list[dict[str, Any]]:
    """Results ordered by method (as asked, earlier ones first) and length."""
    order = {method: i for i, method in enumerate(methods)}
    return sorted(results, key=lambda r: (order.get(r["method"], len(order)), r["method"], r["length"]))


def write_json(path: Path, record: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")


def write_csv(path: Path, results: list[dict[str, Any]], fields: Sequence[str] = CSV_FIELDS) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(results)
    atomic_write_text(path, buffer.getvalue())


def plot_ppl_vs_length(path: Path, results: list[dict[str, Any]], *, trained_context: int | None, title: str) -> None:
    """One line per method, perplexity on a log scale against length, the trained context (if known) marked."""
    fig = ppl_figure(results, trained_context=trained_context, title=title)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))


def ppl_figure(results: list[dict[str, Any]], *, trained_context: int | None, title: str):
    """The figure of :func:`plot_ppl_vs_length` (a `matplotlib.figure.Figure`, outside pyplot)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import LogLocator, MaxNLocator, NullLocator, ScalarFormatter

    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for index, method in enumerate(dict.fromkeys(r["method"] for r in results)):
        points = sorted((r["length"], r["ppl"]) for r in results if r["method"] == method)
        finite = [(n, ppl) for n, ppl in points if math.isfinite(ppl)]
        (line,) = ax.plot([n for n, _ in finite], [ppl for _, ppl in finite], label=method, **line_style(index))
        for n, ppl in points:  # past float range, or NaN: named at the top edge in the method's colour
            if not math.isfinite(ppl):
                label, where = "inf" if ppl > 0 else "NaN", (n, 0.98 - 0.05 * index)
                top = ("data", "axes fraction")
                ax.annotate(label, where, xycoords=top, ha="center", va="top", color=line.get_color())
    if trained_context is not None:
        ax.axvline(trained_context, color="gray", linestyle="--", label=f"trained context ({trained_context})")
    lengths = sorted({r["length"] for r in results})
    ax.set_xscale("log", base=2)
    ax.set_xlim(lengths[0] / 2**0.2, lengths[-1] * 2**0.2)  # room for inf / NaN labels; one length works too
    ax.set_xticks(lengths, [_length_label(n) for n in lengths])
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
    ax.set_ylabel("perplexity")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


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
    """One panel per method: accuracy by length (columns) and depth (rows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(cell["method"] for cell in grid))
    lengths = sorted({cell["length"] for cell in grid})
    depths = sorted({cell["depth"] for cell in grid})
    width = max(5.0, 1.5 + 1.1 * len(lengths) * len(methods))
    fig, axes = plt.subplots(
        1, len(methods), figsize=(width, 1.6 + 0.5 * len(depths)), squeeze=False, sharey=True, layout="constrained"
    )
    for ax, method in zip(axes[0], methods, strict=True):
        values = [[float("nan")] * len(lengths) for _ in depths]
        for cell in grid:
            if cell["method"] == method:
                row, col = depths.index(cell["depth"]), lengths.index(cell["length"])
                values[row][col] = cell["accuracy"]
                ax.text(col, row, f"{cell['accuracy']:.0%}", ha="center", va="center", fontsize=8)
        image = ax.imshow(values, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(lengths)), [_length_label(n) for n in lengths])
        ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
        ax.set_xlabel("length")
        ax.set_title(method, fontsize=9)
    axes[0][0].set_ylabel("depth of the key")
    fig.colorbar(image, ax=axes[0].tolist(), label="accuracy")
    fig.suptitle(title, fontsize=9)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    plt.close(fig)


def format_table(results: list[dict[str, Any]], value: str = "ppl") -> str:
    """Methods as rows, lengths as columns, ``value`` in the cells."""
    lengths = sorted({r["length"] for r in results})
    cells = {(r["method"], r["length"]): r[value] for r in results}
    methods = list(dict.fromkeys(r["method"] for r in results))
    width = max([len("method"), *map(len, methods)])
    lines = ["method".ljust(width) + "".join(f"{_length_label(n):>10}" for n in lengths)]
    for method in methods:
        row = [f"{cells[method, n]:>10.2f}" if (method, n) in cells else f"{'-':>10}" for n in lengths]
        lines.append(method.ljust(width) + "".join(row))
    return "\n".join(lines)


def coverage_note(results: list[dict[str, Any]], documents: int) -> str | None:
    """A line for under the table when lengths scored different documents (those shorter than a window are
    skipped), so their columns compare different texts; None when every length scored the same ones."""
    skipped = {r["length"]: r.get("skipped_documents", 0) for r in results}
    if len(set(skipped.values())) <= 1:
        return None
    counts = ", ".join(f"{documents - n} at {_length_label(length)}" for length, n in sorted(skipped.items()))
    return f"Documents scored (of {documents}; shorter ones are skipped): {counts}. Columns compare different texts."


def _length_label(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)
