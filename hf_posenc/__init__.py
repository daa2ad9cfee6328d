"""hf_posenc: change how a pretrained transformers model encodes position, and measure it.

>>> model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B")
>>> hf_posenc.patch(model, "yarn", factor=4)
>>> hf_posenc.unpatch(model)      # the original, bit for bit
>>> hf_posenc.patch(model, "alibi")  # RoPE (or GPT-2's wpe) replaced by ALiBi biases; also "nope", "t5-bias"

Importing hf_posenc imports torch and transformers and registers its methods, rope types and attention backends
with transformers, so that a plain ``AutoModelForCausalLM.from_pretrained`` loads a saved patched config. The
``hf-posenc`` command alone defers that until its arguments are parsed: ``--help`` answers at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._startup import is_command, quiet_interrupt, require_transformers
from ._version import __version__

require_transformers()

# public name -> the module that defines it
_EXPORTS = {
    "HubError": "hf_posenc.hub.errors",
    "HubPushError": "hf_posenc.hub.errors",
    "from_pretrained": "hf_posenc.hub.push",
    "push_to_hub": "hf_posenc.hub.push",
    "alibi_slopes": "hf_posenc.methods",
    "rope_frequencies": "hf_posenc.methods",
    "sinusoidal_table": "hf_posenc.methods",
    "t5_buckets": "hf_posenc.methods",
    "PatchInfo": "hf_posenc.patching",
    "get_patch": "hf_posenc.patching",
    "patch": "hf_posenc.patching",
    "patched": "hf_posenc.patching",
    "unpatch": "hf_posenc.patching",
    "available_methods": "hf_posenc.registry",
    "MethodSpec": "hf_posenc.spec",
}

__all__ = [
    "HubError",
    "HubPushError",
    "MethodSpec",
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

if TYPE_CHECKING:
    from .hub.errors import HubError, HubPushError
    from .hub.push import from_pretrained, push_to_hub
    from .methods import alibi_slopes, rope_frequencies, sinusoidal_table, t5_buckets
    from .patching import PatchInfo, get_patch, patch, patched, unpatch
    from .registry import available_methods
    from .spec import MethodSpec


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hf_posenc' has no attribute {name!r}")
    importlib.import_module("hf_posenc.methods")  # the registry filled before any name of it is read
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


def _import_all() -> None:
    with quiet_interrupt():  # seconds of torch and transformers: Ctrl-C there is one line in the hf-posenc command
        for name in _EXPORTS:
            __getattr__(name)


if not is_command():
    _import_all()
