"""The methods a run evaluates: parsed once from their specs, told apart from each other and from the rows of a
results file it resumes, and applied to the model in turn."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..hub.saved import SavedPatch, restore_saved_tensors
from ..patching import patched
from ..registry import get_method
from ..spec import MethodSpec
from .defaults import DEFAULT_METHODS

logger = logging.getLogger("hf_posenc")


def parse_methods(texts: Sequence[str] | None, saved: SavedPatch | None = None) -> list[MethodSpec]:
    """Every method spec parsed and checked without a model (``ValueError`` naming the bad one). None: the
    base model and the method a saved patched model carries (:mod:`hf_posenc.hub.saved`; a baked patch, GPT-2 ``pi``,
    cannot be undone: ``none`` is the model as saved, the only default), else ``DEFAULT_METHODS``."""
    if texts is None and saved is not None:
        texts = ("none",) if saved.record.baked else ("none", saved.spec)
    elif texts is None:
        texts = DEFAULT_METHODS
    return [MethodSpec.parse(text, parameter="methods") for text in texts]


def refuse_duplicates(
    specs: list[MethodSpec],
    existing: Sequence[str] = (),
    where: Path | str = "",
    resolved: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Raise ``ValueError`` naming both specs when two of ``specs``, or one of them and a row already in the
    results file ``where`` (``existing`` specs), are the same method (equal :meth:`MethodSpec.identity`).

    ``resolved``: the parameters a model resolved for each spec text (new specs and rows alike), so that
    spellings that differ only in what the model fills in (its trained context) are told to be one method.
    """
    texts = [spec.text for spec in specs]
    rows = [(text, _row_identity(text, resolved)) for text in existing if text not in texts]
    seen = [(text, identity) for text, identity in rows if identity is not None]
    for spec in specs:
        this = spec.identity(None if resolved is None else resolved[spec.text])
        for other, other_identity in seen:
            if this != other_identity:
                continue
            if other in existing:
                raise ValueError(
                    f"`methods` {spec.text!r} is the same method with the same parameters as {other!r}, already in "
                    f"{where}; write it as {other!r} to keep that row, or choose another `output` folder."
                )
            raise ValueError(
                f"`methods` {other!r} and `methods` {spec.text!r} are the same method with the same parameters; "
                "give it once."
            )
        seen.append((spec.text, this))


def _row_identity(text: str, resolved: dict[str, dict[str, Any]] | None) -> tuple[str, dict[str, Any]] | None:
    """The identity of a row already written; None for one that does not build (no
    valid spec can be the same method)."""
    try:
        spec = MethodSpec.parse(text, parameter="methods")
    except ValueError:
        return None
    return spec.identity(None if resolved is None else resolved.get(text, spec.defaults))


def warn_past_reach(spec: MethodSpec, resolved: dict[str, Any], longest: int) -> None:
    """Warn when ``spec``'s position remap (Self-Extend, STRING, Leaky ReRoPE) has a reach, with the parameters
    resolved on the model, shorter than the ``longest`` input: past it the remapped positions leave the trained
    context. The run goes on (how a method fails past its reach is worth measuring), but the table must not be read
    as within it."""
    remap = None if spec.unpatched else get_method(spec.method).part("remap")
    params = None if remap is None else remap.make_params(**remap.own(resolved))
    if params is not None and params.reach is not None and longest > params.reach:
        logger.warning(
            "%s reaches %d tokens (%s on L=%d); its lengths above that (up to %d) put remapped positions past the "
            "trained context.",
            spec.text,
            params.reach,
            params.REACH_FORMULA,
            resolved["original_max_position_embeddings"],
            longest,
        )


@contextmanager
def notes_once() -> Iterator[None]:
    """Within the block, a message the ``hf_posenc`` logger gives again (the trained context assumed, the same for
    every method a run checks) is dropped: each note is read once."""
    seen: set[str] = set()

    def first(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in seen:
            return False
        seen.add(message)
        return True

    logger.addFilter(first)
    try:
        yield
    finally:
        logger.removeFilter(first)


@contextmanager
def method_applied(model, spec: MethodSpec, params: dict[str, Any]) -> Iterator[None]:
    """The model patched with ``spec`` for the duration, from the parameters it resolved when checked (so
    nothing is resolved, or logged, twice); ``none``: unchanged. A saved model's own method gets the tensors it
    was saved with (:func:`~hf_posenc.hub.saved.restore_saved_tensors`: a trained T5 table)."""
    if spec.unpatched:
        yield
        return
    with patched(model, spec.method, **params):
        restore_saved_tensors(model)
        yield
