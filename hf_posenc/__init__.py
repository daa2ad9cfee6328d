"""hf_posenc: change how a pretrained transformers model encodes position, and measure it.

>>> model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B")
>>> hf_posenc.patch(model, "yarn", factor=4)
>>> hf_posenc.unpatch(model)      # the original, bit for bit
>>> hf_posenc.patch(model, "alibi")  # RoPE (or GPT-2's wpe) replaced by ALiBi biases
"""

from __future__ import annotations

__version__ = "0.1.0"

from .hub import HubError, HubPushError, from_pretrained, push_to_hub  # noqa: E402
from .methods import alibi_slopes, rope_frequencies  # noqa: E402
from .patching import PatchInfo, get_patch, patch, patched, unpatch  # noqa: E402
from .registry import available_methods  # noqa: E402

__all__ = [
    "HubError",
    "HubPushError",
    "PatchInfo",
    "alibi_slopes",
    "available_methods",
    "from_pretrained",
    "get_patch",
    "patch",
    "patched",
    "push_to_hub",
    "rope_frequencies",
    "unpatch",
]
