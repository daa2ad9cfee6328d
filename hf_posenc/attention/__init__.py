"""Attention functions by family: biases (ALiBi, the T5 bias), the position remaps (Self-Extend, DCA) and the log-n
temperature, each family's backends declared once in :mod:`~hf_posenc.attention.backends`.

:mod:`hf_posenc.patching.registrations` registers them with transformers' attention and mask interfaces. A patched
model selects one through its config's attention implementation, so transformers' own dispatch calls it; the
matching mask function makes padding and the KV cache reach it.
"""

from __future__ import annotations

from .backends import ALIBI, REMAP, T5, TABLES, TEMPERATURE, Backend, BackendTable

__all__ = ["ALIBI", "REMAP", "T5", "TABLES", "TEMPERATURE", "Backend", "BackendTable"]
