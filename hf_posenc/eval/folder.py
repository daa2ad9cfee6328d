"""The output folder of an eval or passkey run: the one owner of its files.

:class:`ResultsFolder` checks the folder before a run (a place it can write, no files of someone else's), reads
the report a killed run left there (same arguments: resumed), clears what a killed run left half-written, and
writes the report with the CSV and the plot made from it, each file atomically (:mod:`hf_posenc.files`), only over
what this run read or wrote itself. What must match for a resume besides the arguments (the data, BOS, the model,
the prompts) is :mod:`.resume`'s.
"""

from __future__ import annotations

import contextlib
import csv
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files import (
    CHECK_PREFIX,
    atomic_write_text,
    json_text,
    nearest_existing,
    remove_temporaries,
    same_place,
    stale,
    write_problem,
)
from ..plots.figures import plot_passkey_heatmap, plot_ppl_vs_length
from ..reports.schema import RUN_DETAILS, RUN_FIELDS, fields_problem, read_report, report_for_file
from .resume import scored_bos

RESULTS_JSON = "results.json"
RESULTS_CSV = "results.csv"
PPL_PLOT = "ppl_vs_length.png"
PASSKEY_JSON = "passkey.json"
PASSKEY_CSV = "passkey.csv"
PASSKEY_PLOT = "passkey_heatmap.png"
PERPLEXITY_FILES = (RESULTS_JSON, RESULTS_CSV, PPL_PLOT)  # the report first: the others are made from it
PASSKEY_FILES = (PASSKEY_JSON, PASSKEY_CSV, PASSKEY_PLOT)
CSV_FIELDS = (
    "method",
    "length",
    "ppl",
    "nll",
    "tokens",
    "windows",
    "documents",
    "skipped_documents",
    "dropped_tokens",
    "forwards",
    "derived_from",
    "seconds",
)


_ADVICE = "move it away or choose another `output` folder"


def check_output(folder: Path, files: Sequence[str]) -> None:
    """Raise ``ValueError`` unless results named ``files`` (the report first) can be written to ``folder``: a
    writable folder, or one that can be created, that holds none of ``files`` without the report. A
    temporary folder is made and removed to check (permissions alone mislead root)."""
    existing = nearest_existing(folder)
    if not existing.is_dir():
        raise ValueError(f"Cannot write results to {folder}: {existing} is a file. Choose another `output`.")
    problem = write_problem(existing)
    if problem is not None:
        place = "" if existing == folder else f" (cannot create a folder in {existing})"
        raise ValueError(f"Cannot write results to {folder}{place}: {problem}. Choose another `output`.")
    report, *made = files
    blocked = next((name for name in files if (folder / name).exists() and not (folder / name).is_file()), None)
    if blocked is not None:  # found before the run, not when it writes there at the end
        raise ValueError(
            f"{folder / blocked} is not a file, and this run writes its {blocked} there. Move it away or choose "
            "another `output` folder."
        )
    foreign = [name for name in made if (folder / name).exists()]
    if existing == folder and foreign and not (folder / report).exists():
        raise ValueError(
            f"{folder} holds {' and '.join(foreign)} but no {report}: files this run would overwrite, not results "
            f"it can resume. Move them away or choose another `output` folder."
        )


def load_previous(path: Path, arguments: dict[str, Any], *, kind: str) -> dict[str, Any] | None:
    """The report already in ``path`` for the same ``arguments``, checked (:mod:`hf_posenc.reports.schema`);
    None if there is no file.

    Raises:
        `ValueError`: the file is not a results file of ``kind``, is malformed, or holds results of other
            arguments (it is left untouched either way).
    """
    if not path.exists():
        return None
    previous = read_report(path, kind=kind, advice=_ADVICE)
    problem = fields_problem(previous, {"arguments": (dict,)}, "the file")
    if kind == "perplexity":
        problem = problem or fields_problem(previous, RUN_FIELDS, "the file")
        for key, fields in RUN_DETAILS.items():
            problem = problem or fields_problem(previous[key], fields, repr(key))
    if problem:
        raise ValueError(f"{path} is malformed: {problem}; {_ADVICE}.")
    before = previous["arguments"]
    keys = sorted((set(arguments) | set(before)) - ({"bos"} if isinstance(scored_bos(previous), bool) else set()))
    changed = [key for key in keys if not _alike(before.get(key), arguments.get(key), key)]
    if changed:
        values = "; ".join(f"{key}: {before.get(key)!r} then, {arguments.get(key)!r} now" for key in changed)
        raise ValueError(
            f"{path} holds results of different arguments ({values}); "
            "choose another `output` folder or rerun with the same arguments to resume."
        )
    return previous


_PATHS = ("model", "gguf_file", "name")  # the arguments that may name a local file or folder (the dataset's: name)


def _alike(before: Any, now: Any, key: str = "") -> bool:
    """Equal, or (a path argument) naming the same existing local file or folder (``texts/``, ``./texts``; the data
    and the weights are then compared by :func:`check_same_data` and :func:`check_same_model`); dicts key by key."""
    if isinstance(before, dict) and isinstance(now, dict):
        return before.keys() == now.keys() and all(_alike(before[name], now[name], name) for name in before)
    if key in _PATHS and isinstance(before, str) and isinstance(now, str) and before and now:
        return same_place(before, now)
    return before == now


def remove_stale_temporaries(folder: Path, files: Sequence[str]) -> None:
    """Remove what a killed run left in ``folder``: the temporary files of ``files``' atomic writes
    (:func:`hf_posenc.files.remove_temporaries`) and its empty check folders (:func:`check_output`), once
    :func:`~hf_posenc.files.stale`."""
    if not folder.is_dir():
        return
    for name in files:
        remove_temporaries(folder / name)
    for path in folder.glob(f"{CHECK_PREFIX}*"):
        if path.is_dir() and stale(path):  # not one another run is checking with now
            with contextlib.suppress(OSError):  # not empty: not one of ours
                path.rmdir()


class SoleWriter:
    """The report file of a run, written only over what the run read or wrote itself.

    Two runs given one output folder would each rewrite the report from what they read, and the rows of the one
    that wrote first be lost without a word. Each write first checks that the file is still what this run last
    saw (read at the start, or written since); if another process wrote it, the run stops without writing.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen = self._contents()

    def _contents(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    def write(self, write: Callable[..., None], *args: Any) -> None:
        """``write(*args)`` (which writes the report and the files made from it) if the report is as last seen."""
        if self._contents() != self._seen:
            raise ValueError(
                f"{self.path} was written by another process while this run went on (two runs with one `output` "
                "folder?): this run stops without writing over it. Rerun when the other has finished: it resumes "
                "from that file."
            )
        write(*args)
        self._seen = self._contents()


def write_json(path: Path, report: dict[str, Any]) -> None:
    """The report as standard JSON: a row whose perplexity is not finite has nulls and a ``status``."""
    atomic_write_text(path, json_text(report_for_file(report)))


def write_csv(path: Path, results: list[dict[str, Any]], fields: Sequence[str] = CSV_FIELDS) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(results)
    atomic_write_text(path, buffer.getvalue())


def write_perplexity_results(output: Path, report: dict[str, Any]) -> None:
    """results.json, results.csv and ppl_vs_length.png of ``report`` (each written atomically)."""
    write_json(output / RESULTS_JSON, report)
    write_csv(output / RESULTS_CSV, report["results"])
    details = report["protocol_details"]
    title = (
        f"{report['model']} on {report['dataset']}\nprotocol {report['protocol']}, "
        f"{'BOS prepended' if details['bos'] else 'no BOS'}, {report['model_details']['dtype']}"
    )
    plot_ppl_vs_length(
        output / PPL_PLOT,
        report["results"],
        trained_context=report["model_details"]["trained_context"],
        title=title,
    )


def write_passkey_results(output: Path, report: dict[str, Any]) -> None:
    """passkey.json, passkey.csv (accuracy by method, length and depth) and passkey_heatmap.png (each
    written atomically)."""
    write_json(output / PASSKEY_JSON, report)
    write_csv(output / PASSKEY_CSV, report["accuracy"], fields=("method", "length", "depth", "accuracy", "trials"))
    plot_passkey_heatmap(output / PASSKEY_PLOT, report["accuracy"], title=f"passkey retrieval: {report['model']}")


@dataclass(frozen=True)
class FolderLayout:
    """The files of one kind of run: the report (first: the others are made from it), its CSV and its plot."""

    kind: str  # the report's kind for :func:`~hf_posenc.reports.schema.read_report`
    files: tuple[str, ...]
    write: Callable[[Path, dict[str, Any]], None]


PERPLEXITY = FolderLayout("perplexity", PERPLEXITY_FILES, write_perplexity_results)
PASSKEY = FolderLayout("passkey", PASSKEY_FILES, write_passkey_results)


class ResultsFolder:
    """The output folder of one run: checked before the run, its earlier report read to resume, its files written.

    Args:
        path (`Path`): the folder (made when first written).
        layout (`FolderLayout`): :data:`PERPLEXITY` or :data:`PASSKEY`.
    """

    def __init__(self, path: Path, layout: FolderLayout) -> None:
        self.path, self.layout = Path(path), layout
        self._writer: SoleWriter | None = None

    @property
    def report_path(self) -> Path:
        return self.path / self.layout.files[0]

    def check(self) -> None:
        """``ValueError`` unless the run's files can be written here (:func:`check_output`)."""
        check_output(self.path, self.layout.files)

    def previous(self, arguments: dict[str, Any]) -> dict[str, Any] | None:
        """The report already here for the same ``arguments``, checked; None where there is none
        (:func:`load_previous`). From then on, the run writes only over that report, or over what it wrote itself
        (:class:`SoleWriter`)."""
        self._writer = SoleWriter(self.report_path)
        return load_previous(self.report_path, arguments, kind=self.layout.kind)

    def clean(self) -> None:
        """Remove what a killed run left half-written (:func:`remove_stale_temporaries`)."""
        remove_stale_temporaries(self.path, self.layout.files)

    def write(self, report: dict[str, Any]) -> None:
        """The report, its CSV and its plot, each atomically; ``ValueError`` if another process wrote the report
        since :meth:`previous` read it."""
        if self._writer is None:
            raise RuntimeError("ResultsFolder.write before previous(): the report it may replace was never read.")
        self._writer.write(self.layout.write, self.path, report)
