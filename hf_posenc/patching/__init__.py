"""Everything that changes a model, and nothing else does.

* :mod:`~.plan`: what a patch is before it touches the model (:class:`~.plan.Plan`), and what a planner is.
* :mod:`~.apply`: apply a plan with a record of all it changes, restore it exactly (``patch``, ``unpatch``).
* :mod:`~.dispatch`: the table of planners, and which one serves a method on a model.
* planners, one module per kind of change, never importing each other: :mod:`~.rope` (RoPE scaling),
  :mod:`~.bias` (attention biases: ALiBi, T5), :mod:`~.encodings` (NoPE, sinusoidal),
  :mod:`~.attention_level` (Self-Extend, DCA, log-n), :mod:`~.learned` (learned tables: GPT-2 PI);
  :mod:`~.changes` holds what they share. What they share about a model lives in :mod:`hf_posenc.architectures`.
* :mod:`~.registrations`: hf_posenc's rope types and attention backends, registered with transformers on import.
* :mod:`~.wrappers`: the model inside peft, ``torch.compile`` and data-parallel wrappers; accelerate's hooks.
* :mod:`~.rope_types`: a RoPE method in ``rope_parameters``, and hf_posenc's own rope types.
* :mod:`~.loading`: loading a saved patched model, through the method's planner (what
  :func:`hf_posenc.from_pretrained` does for a repo with weights).
"""

from __future__ import annotations

from . import registrations  # noqa: F401  (transformers learns hf_posenc's rope types and attention backends)
from .apply import (
    DryRun,
    added_tensors,
    dry_run,
    get_patch,
    learned_table_rows,
    patch,
    patched,
    trained_tensors,
    unpatch,
)
from .loading import load_patched_model
from .plan import PatchInfo

__all__ = [
    "DryRun",
    "PatchInfo",
    "dry_run",
    "added_tensors",
    "get_patch",
    "learned_table_rows",
    "load_patched_model",
    "patch",
    "patched",
    "trained_tensors",
    "unpatch",
]
