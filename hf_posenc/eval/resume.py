"""Resuming a run: what must hold, besides its arguments (:meth:`.folder.ResultsFolder.previous`), before rows of
an earlier run are kept beside new ones.

A results file remembers a hash of the tokens of every document scored (``dataset_details["document_hashes"]``),
of every passkey prompt, the BOS it scored with and the model's fingerprint; a run on other data, prompts, BOS or
weights refuses the folder instead of mixing results. Every check reads only.
"""

from __future__ import annotations

import hashlib
from array import array
from pathlib import Path
from typing import Any


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
