"""Resuming a run in its output folder: what must hold before anything in it is written.

A results file remembers the arguments that define its numbers (``"arguments"``) and a hash of the tokens
of every document scored (``dataset_details["document_hashes"]``); a run with other arguments or other
data refuses the folder instead of mixing or overwriting results. Files of the run's names that no
results file of this kind accounts for belong to someone else, and are refused too. Every check reads
only; the one change, :func:`remove_stale_temporaries`, touches only files a killed run of ours left.
"""

from __future__ import annotations

import contextlib
import hashlib
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..files import CHECK_PREFIX, nearest_existing, remove_temporaries, same_place, stale, write_problem
from ..reports.schema import RUN_DETAILS, RUN_FIELDS, fields_problem, read_report

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


def document_hashes(docs: list[list[int]]) -> list[str]:
    """A short SHA-256 of each document's token ids: the fingerprint of what a run scores."""
    return [hashlib.sha256(array("q", doc).tobytes()).hexdigest()[:16] for doc in docs]


def check_same_data(before: dict[str, Any], now: dict[str, Any], path: Path) -> None:
    """Raise ``ValueError`` if the ``dataset_details`` of the results in ``path`` (``before``) describe other
    documents than this run's (``now``): other counts, or a document whose tokens changed. Results written
    without document hashes compare by counts."""
    then_counts, now_counts = _counts(before), _counts(now)
    if then_counts != now_counts:
        raise ValueError(
            f"The results in {path} were computed on other data: {then_counts} then, {now_counts} now. "
            "Choose another `output` folder."
        )
    old = before.get("document_hashes")
    if old is None:
        return
    changed = [i for i, (a, b) in enumerate(zip(old, now["document_hashes"], strict=False)) if a != b]
    if changed or len(old) != len(now["document_hashes"]):
        which = f"document {changed[0]}" if changed else "the documents"
        raise ValueError(
            f"The results in {path} were computed on other data: {which} has other tokens now (same counts; "
            "the text or the tokenizer changed). Choose another `output` folder."
        )


def scored_bos(report: dict[str, Any]) -> bool | None:
    """Whether the rows of ``report`` (a perplexity or passkey results file) were scored with a BOS token; None
    in a passkey file that does not say."""
    return report["protocol_details"]["bos"] if "protocol_details" in report else report.get("bos")


def check_same_bos(before: dict[str, Any], bos: str, bos_id: int | None, path: Path) -> None:
    """Raise ``ValueError`` if the results in ``path`` (``before``) were scored with a BOS token where this run
    (``--bos bos``, resolved to ``bos_id``) scores none, or the other way round: the rows of one file share one
    protocol. ``--bos`` is compared by what it resolves to, so ``auto`` and ``none`` are one where the tokenizer adds
    no BOS; ``auto`` follows the tokenizer, which may have changed under the same model name."""
    then, now = scored_bos(before), bos_id is not None
    if then is not None and then != now:
        said = ("with", "without") if then else ("without", "with")
        follows = "; it follows the tokenizer" if bos == "auto" else ""
        raise ValueError(
            f"The results in {path} were scored {said[0]} a BOS token; this run would score {said[1]} one (`--bos "
            f"{bos}`{follows}). Rerun with the `--bos` that scores as they were, or choose another `output` folder."
        )


def check_same_model(before: dict[str, Any], now: dict[str, Any], path: Path) -> None:
    """Raise ``ValueError`` if the ``model_details`` of the results in ``path`` (``before``) describe another model
    than the one loaded now (``now``) under the same arguments: another fingerprint
    (:func:`~hf_posenc.hub.fingerprint.model_fingerprint`: weights retrained or replaced in the same folder, another
    commit of a branch) or trained context (its config edited). Files without fingerprints
    compare what they hold."""
    for key, what in (("fingerprint", "weights differ"), ("trained_context", "trained context differs")):
        if key in before and key in now and before[key] != now[key]:
            raise ValueError(
                f"The results in {path} were computed on another model under the same name: its {what} "
                f"({before[key]} then, {now[key]} now). Choose another `output` folder."
            )


def prompt_hashes(prompts: dict[int, list[list[int]]]) -> dict[str, str]:
    """Per passkey length (a JSON key: its decimal string), a short SHA-256 of all its prompts' token ids."""
    joined = {length: [token for ids in batch for token in ids] for length, batch in prompts.items()}
    return {str(length): document_hashes([tokens])[0] for length, tokens in joined.items()}


def check_same_prompts(before: dict[str, str] | None, now: dict[str, str], path: Path) -> None:
    """Raise ``ValueError`` if a length scored in ``path`` had other prompt tokens than this run's (the tokenizer
    changed under the same model name). Files without prompt hashes are not compared."""
    changed = sorted(int(n) for n in now if before and n in before and before[n] != now[n])
    if changed:
        raise ValueError(
            f"The results in {path} were computed on other passkey prompts: the tokens at length {changed[0]} "
            "differ now (same arguments; the tokenizer changed). Choose another `output` folder."
        )


def _counts(details: dict[str, Any]) -> str:
    return f"{details['documents']} documents of {details['tokens']} tokens"


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
