"""A saved tokenizer's ``model_max_length`` raised with the context a patch extends.

vLLM serves at most the smaller of the config's context (``max_position_embeddings``) and the tokenizer's
``model_max_length`` (``tokenizer_config.json``), before it scales that by a linear or dynamic factor (vLLM 0.33,
``vllm/config/model.py``, ``_get_and_verify_max_len``). A tokenizer saved as the base's says the base's context, so a
YaRN ×4 model saved with it is served at the base's context. Where hf_posenc saves a tokenizer beside a patched model
(``push --with-weights``, ``train``), a ``model_max_length`` from the base's context up to below the patched one is
raised to the patched one; one below the base's context was set lower on purpose and is kept, as are the sentinel
values of tokenizers without a limit (``1e30``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .files import atomic_write_text
from .record import PatchRecord

TOKENIZER_CONFIG = "tokenizer_config.json"


def raised_model_max_length(model_max_length: Any, base_context: int, context: int) -> int | None:
    """The ``model_max_length`` a tokenizer saved with a model whose context went from ``base_context`` to
    ``context`` should say: ``context`` where ``base_context <= model_max_length < context``, else None (kept)."""
    number = isinstance(model_max_length, int) and not isinstance(model_max_length, bool)
    return context if number and base_context <= model_max_length < context else None


def follow_context(folder: str | Path, config: Any) -> int | None:
    """Raise ``model_max_length`` in ``folder``'s ``tokenizer_config.json`` to the context of ``config`` (a patched
    model's) where :func:`raised_model_max_length` says so. Returns the new value, or None where nothing changed (no
    tokenizer file, no patch record, no longer context, a value kept)."""
    path = Path(folder) / TOKENIZER_CONFIG
    record = PatchRecord.from_config(config, missing_ok=True)
    context = getattr(config, "max_position_embeddings", None)
    if record is None or context is None or not path.is_file():
        return None
    base_context = getattr(record.base_config(config), "max_position_embeddings", None)
    saved = json.loads(path.read_text(encoding="utf-8"))
    length = saved.get("model_max_length")
    raised = None if base_context is None else raised_model_max_length(length, base_context, context)
    if raised is not None:
        saved["model_max_length"] = raised
        atomic_write_text(path, json.dumps(saved, indent=2, ensure_ascii=False) + "\n")
    return raised
