"""hf_posenc: change how a pretrained transformers model encodes position, and measure it.

>>> model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B")
>>> hf_posenc.patch(model, "yarn", factor=4)
>>> hf_posenc.unpatch(model)      # the original, bit for bit
>>> hf_posenc.patch(model, "alibi")  # RoPE (or GPT-2's wpe) replaced by ALiBi biases; also "nope", "t5-bias"
>>> report = hf_posenc.tune(model, tokenizer, texts, target_length=32768)  # the best method to 32k, measured

Importing hf_posenc imports torch and transformers and registers its methods, rope types and attention backends
with transformers, so that a plain ``AutoModelForCausalLM.from_pretrained`` loads a saved patched config. The
``hf-posenc`` command alone defers that until its arguments are parsed: ``--help`` answers at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._startup import is_command, lazy_exports, quiet_interrupt, require_transformers
from ._version import __version__

require_transformers()

# public name -> the module that defines it; the methods first, so that the registry is filled when the rest loads
_EXPORTS = {
    "alibi_slopes": ".methods",
    "rope_frequencies": ".methods",
    "sinusoidal_table": ".methods",
    "t5_buckets": ".methods",
    "available_methods": ".registry",
    "MethodSpec": ".spec",
    "PatchInfo": ".patching",
    "get_patch": ".patching",
    "patch": ".patching",
    "patched": ".patching",
    "unpatch": ".patching",
    "HubError": ".hub.errors",
    "HubPushError": ".hub.errors",
    "from_pretrained": ".hub.push",
    "push_to_hub": ".hub.push",
}
# exported, imported on first use only: evaluation brings accelerate and datasets
_ON_USE = {"tune": ".tuning.search"}

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
    "tune",
    "unpatch",
]

if TYPE_CHECKING:
    from .hub.errors import HubError, HubPushError
    from .hub.push import from_pretrained, push_to_hub
    from .methods import alibi_slopes, rope_frequencies, sinusoidal_table, t5_buckets
    from .patching import PatchInfo, get_patch, patch, patched, unpatch
    from .registry import available_methods
    from .spec import MethodSpec
    from .tuning.search import tune


__getattr__, __dir__ = lazy_exports(__name__, {**_EXPORTS, **_ON_USE})


def _import_all() -> None:
    with quiet_interrupt():  # seconds of torch and transformers: Ctrl-C there is one line in the hf-posenc command
        for name in _EXPORTS:
            __getattr__(name)


if not is_command():
    _import_all()
