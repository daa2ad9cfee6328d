"""The model under evaluation: where it comes from, loading it, and what it can take."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from ..architectures import positions_of
from ..hub_errors import HubError, call_hub
from ..patching import get_patch
from ..registry import get_method
from ..saved import SavedPatch, load_base_model, loading_errors, saved_patch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelSource:
    """A Hub id or local folder, optionally a GGUF file in it, and the dtype (``auto``: bf16 on GPU)."""

    name: str
    gguf_file: str | None = None
    dtype: str = "auto"

    @property
    def label(self) -> str:
        """Short name for tables and plots: the Hub id, or folder/file of a GGUF."""
        return f"{Path(self.name).name}/{self.gguf_file}" if self.gguf_file else self.name

    def resolved_dtype(self, device: torch.device) -> str:
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if device.type == "cuda" else "float32"

    def saved_patch(self) -> SavedPatch | None:
        """The patch the model was saved or pushed with (read from its config), or None."""
        return saved_patch(self.name, gguf_file=self.gguf_file)


def load_model(source: ModelSource, device: torch.device, saved: SavedPatch | None = None):
    """The base model, in eval mode, on ``device``: a saved patch (``source.saved_patch()``) undone, so that
    every method evaluated applies to the base (:mod:`hf_posenc.saved`)."""
    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    dtype = DTYPES[source.resolved_dtype(device)]
    return load_base_model(source.name, saved, dtype=dtype, **kwargs).to(device).eval()


def load_tokenizer(source: ModelSource, saved: SavedPatch | None = None):
    """The tokenizer of ``source`` (cheap next to the model: loaded first, to check the data); a config-only
    push's from the repo and commit its weights come from."""
    if saved is not None and saved.weights_from is not None:
        repo, revision = saved.weights_from, saved.weights_revision
        action = f"Reading the tokenizer of {repo!r}"
        return call_hub(lambda: AutoTokenizer.from_pretrained(repo, revision=revision), HubError, action, None)
    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    with loading_errors(source.name, source.gguf_file):
        return AutoTokenizer.from_pretrained(source.name, **kwargs)


def trained_context(config: Any) -> int:
    """The context the model was trained on: ``original_max_position_embeddings`` if set, else the max."""
    rope = getattr(config, "rope_parameters", None) or {}
    original = rope.get("original_max_position_embeddings") if isinstance(rope, dict) else None
    return int(original or getattr(config, "max_position_embeddings", None) or config.n_positions)


def resolve_bos(bos: str, tokenizer) -> int | None:
    """The BOS id to prepend to every window, or None. ``auto``: prepend iff the tokenizer adds one."""
    if bos == "none":
        return None
    if tokenizer.bos_token_id is None:
        if bos == "prepend":
            raise ValueError("`bos` 'prepend' was asked but the tokenizer has no BOS token.")
        return None
    if bos == "prepend":
        return tokenizer.bos_token_id
    adds = tokenizer("a", add_special_tokens=True)["input_ids"][:1] == [tokenizer.bos_token_id]
    return tokenizer.bos_token_id if adds else None


def check_position_table(model, method: str, longest: int) -> None:
    """Raise ``ValueError`` if ``model`` (patched with the method spec ``method``) looks positions up in a
    learned table (GPT-2's ``wpe``) with fewer rows than ``longest`` input tokens; RoPE and the methods that
    replace the table (ALiBi, NoPE, sinusoidal, the T5 bias) take any length."""
    patch = get_patch(model)
    if positions_of(model).kind != "learned" or (patch is not None and get_method(patch.method).role == "replace"):
        return
    rows = model.config.max_position_embeddings  # GPT-2's n_positions under transformers' common name
    if longest > rows:
        raise ValueError(
            f"`methods` {method!r}: {type(model).__name__} has a learned table of {rows} positions, and the longest "
            f"input here has {longest} tokens. Evaluate it at `lengths` up to {rows} (runs with the same `output` "
            "add up), or with a method that extends or replaces the table (pi:factor=..., alibi, sinusoidal)."
        )


def model_details(model_source: ModelSource, saved: SavedPatch | None, dtype: str) -> dict[str, Any]:
    """What the results say of the model: its name, and for a saved patched model the method it was saved
    with and the repo its weights came from (``none`` rows are that base)."""
    return {
        "name": model_source.name,
        "gguf_file": model_source.gguf_file,
        "dtype": dtype,
        "saved_patch": saved.spec if saved else None,
        "weights_from": saved.weights_from if saved else None,
    }
