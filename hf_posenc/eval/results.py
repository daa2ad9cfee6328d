"""What a perplexity or passkey report shows besides its rows: the versions and device it ran on, the order of its
rows, and the console table with the notes under it (:mod:`.folder` writes the files)."""

from __future__ import annotations

import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .._version import __version__
from ..plots.figures import length_label


def versions() -> dict[str, str]:
    """Versions of the packages that decide the numbers, and the Python and platform."""
    import accelerate
    import datasets
    import torch
    import transformers

    return {
        "hf_posenc": __version__,
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


def sort_results(results: list[dict[str, Any]], methods: list[str]) -> list[dict[str, Any]]:
    """Results ordered by method (as asked, earlier ones first) and length."""
    order = {method: i for i, method in enumerate(methods)}
    return sorted(results, key=lambda r: (order.get(r["method"], len(order)), r["method"], r["length"]))


def format_table(results: list[dict[str, Any]], value: str = "ppl") -> str:
    """Methods as rows, lengths as columns, ``value`` in the cells."""
    lengths = sorted({r["length"] for r in results})
    cells = {(r["method"], r["length"]): r[value] for r in results}
    methods = list(dict.fromkeys(r["method"] for r in results))
    width = max([len("method"), *map(len, methods)])
    lines = ["method".ljust(width) + "".join(f"{length_label(n):>10}" for n in lengths)]
    for method in methods:
        row = [f"{cells[method, n]:>10.2f}" if (method, n) in cells else f"{'-':>10}" for n in lengths]
        lines.append(method.ljust(width) + "".join(row))
    return "\n".join(lines)


def coverage_note(results: list[dict[str, Any]], documents: int) -> str | None:
    """A line for under the table when lengths scored different documents (those shorter than a window are
    skipped), so their columns compare different texts; None when every length scored the same ones."""
    scored = {r["length"]: r.get("documents", documents - r.get("skipped_documents", 0)) for r in results}
    if len(set(scored.values())) <= 1:
        return None
    counts = ", ".join(f"{n} at {length_label(length)}" for length, n in sorted(scored.items()))
    return f"Documents scored (of {documents}; shorter ones are skipped): {counts}. Columns compare different texts."


def derivation_note(results: list[dict[str, Any]]) -> str | None:
    """A line for under the table naming the lengths read from the forward of a longer window of each document
    (rows with ``derived_from``), and the methods they apply to when not all; None when there are none."""
    sources: dict[str, dict[int, list[int]]] = {}
    for row in results:
        if row.get("derived_from"):
            sources.setdefault(row["method"], {}).setdefault(row["derived_from"], []).append(row["length"])
    if not sources:
        return None
    groups: dict[str, list[str]] = {}
    for method, by_source in sources.items():
        phrase = ", ".join(
            f"{', '.join(map(length_label, sorted(lengths)))} derived from the {length_label(source)} forward"
            for source, lengths in sorted(by_source.items())
        )
        groups.setdefault(phrase, []).append(method)
    if len(sources) == len({row["method"] for row in results}) and len(groups) == 1:
        return f"{next(iter(groups))} of each document (one forward per document; see --help)."
    parts = [f"{phrase} of each document for {', '.join(methods)}" for phrase, methods in groups.items()]
    return f"{'; '.join(parts)}; the other rows: one forward per length (see --help)."
