"""Attention backends: one attention function and one mask function per backend, for ALiBi, the T5 bias and the
remap and temperature methods (:mod:`~hf_posenc.attention.extension`).

:mod:`hf_posenc.registrations` registers them with transformers' attention and mask interfaces under
the names below (namespaced, additive: models that do not select them are unaffected). A patched model
selects one through its config's attention implementation, so transformers' own dispatch calls it; the
matching mask function makes padding and the KV cache reach it.
"""

from __future__ import annotations

from .extension import (
    extension_eager_attention,
    extension_mask,  # noqa: F401  (registered by hf_posenc.registrations)
    temperature_attention,
)
from .extension_blocks import extension_blocked_attention, extension_sdpa_attention
from .extension_flex import extension_flex_attention
from .functions import alibi_cudnn_attention, alibi_eager_attention, alibi_flex_attention, alibi_sdpa_attention
from .masks import alibi_distance_mask, alibi_flex_mask, alibi_prefill_mask
from .t5 import t5_eager_attention, t5_flex_attention, t5_sdpa_attention

IMPLEMENTATIONS = {
    "eager": "hf_posenc_alibi_eager",
    "sdpa": "hf_posenc_alibi_sdpa",
    "flex": "hf_posenc_alibi_flex",
    "cudnn": "hf_posenc_alibi_cudnn",
}
# backend -> (attention function, mask function)
FUNCTIONS = {
    "eager": (alibi_eager_attention, alibi_distance_mask),
    "sdpa": (alibi_sdpa_attention, alibi_distance_mask),
    "flex": (alibi_flex_attention, alibi_flex_mask),
    "cudnn": (alibi_cudnn_attention, alibi_prefill_mask),
}
# T5 bias: backend -> implementation name, (attention function, mask function); the masks are ALiBi's (positions).
T5_IMPLEMENTATIONS = {"eager": "hf_posenc_t5_eager", "sdpa": "hf_posenc_t5_sdpa", "flex": "hf_posenc_t5_flex"}
T5_FUNCTIONS = {
    "eager": (t5_eager_attention, alibi_distance_mask),
    "sdpa": (t5_sdpa_attention, alibi_distance_mask),
    "flex": (t5_flex_attention, alibi_flex_mask),
}

# Self-Extend and DCA (with log-n where combined): backend -> implementation name, and its functions.
EXTENSION_IMPLEMENTATIONS = {
    "eager": "hf_posenc_extension_eager",
    "blocked": "hf_posenc_extension_blocked",
    "sdpa": "hf_posenc_extension_sdpa",
    "flex": "hf_posenc_extension_flex",
}
EXTENSION_BACKEND_OF = {name: backend for backend, name in EXTENSION_IMPLEMENTATIONS.items()}
EXTENSION_FUNCTIONS = {
    "eager": extension_eager_attention,
    "blocked": extension_blocked_attention,
    "sdpa": extension_sdpa_attention,
    "flex": extension_flex_attention,
}
# log-n alone wraps the model's own implementation: its name -> the wrapper's name.
TEMPERATURE_BASES = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3")
TEMPERATURE_IMPLEMENTATIONS = {base: f"hf_posenc_logn_{base}" for base in TEMPERATURE_BASES}
TEMPERATURE_FUNCTIONS = {base: temperature_attention(base) for base in TEMPERATURE_BASES}
