"""hf_posenc: change how a pretrained transformers model encodes position, and measure it.

>>> model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B")
>>> hf_posenc.patch(model, "yarn", factor=4)
>>> hf_posenc.unpatch(model)      # the original, bit for bit
>>> hf_posenc.patch(model, "alibi")  # RoPE (or GPT-2's wpe) replaced by ALiBi biases; also "nope", "t5-bias"
"""

from __future__ import annotations

from ._startup import quiet_interrupt, require_transformers
from ._version import __version__

with quiet_interrupt():  # seconds of torch and transformers: Ctrl-C there is one line in the hf-posenc command
    require_transformers()
    from .hub import HubError, HubPushError, from_pretrained, push_to_hub
    from .methods import alibi_slopes, rope_frequencies, sinusoidal_table, t5_buckets
    from .patching import PatchInfo, get_patch, patch, patched, unpatch
    from .registry import available_methods

__all__ = [
    "HubError",
    "HubPushError",
    "PatchInfo",
    "__version__",
    "alibi_slopes",
    "available_methods",
    "from_pretrained",
    "get_patch",
    "patch",
    "patched",
    "push_to_hub",
    "rope_frequencies",
    "sinusoidal_table",
    "t5_buckets",
    "unpatch",
]
