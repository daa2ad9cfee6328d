"""ALiBi attention backends: one attention function and one mask function per backend.

:mod:`hf_posenc.registrations` registers them with transformers' attention and mask interfaces under
the names below (namespaced, additive: models that do not select them are unaffected). A patched model
selects one through its config's attention implementation, so transformers' own dispatch calls it; the
matching mask function makes padding and the KV cache reach it.
"""

from __future__ import annotations

from .functions import alibi_cudnn_attention, alibi_eager_attention, alibi_flex_attention, alibi_sdpa_attention
from .masks import alibi_distance_mask, alibi_flex_mask, alibi_prefill_mask

IMPLEMENTATIONS = {
    "eager": "hf_posenc_alibi_eager",
    "sdpa": "hf_posenc_alibi_sdpa",
    "flex": "hf_posenc_alibi_flex",
    "cudnn": "hf_posenc_alibi_cudnn",
}
BACKEND_OF = {name: backend for backend, name in IMPLEMENTATIONS.items()}
# backend -> (attention function, mask function)
FUNCTIONS = {
    "eager": (alibi_eager_attention, alibi_distance_mask),
    "sdpa": (alibi_sdpa_attention, alibi_distance_mask),
    "flex": (alibi_flex_attention, alibi_flex_mask),
    "cudnn": (alibi_cudnn_attention, alibi_prefill_mask),
}
