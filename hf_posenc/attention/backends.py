"""Every attention backend hf_posenc registers with transformers, declared once per family.

A family (ALiBi, the T5 bias, the position remaps, the log-n temperature) is a :class:`BackendTable` of
:class:`Backend` rows: the short name a method's ``backend`` parameter takes, the implementation name registered with
transformers' ``AttentionInterface`` and ``AttentionMaskInterface`` (namespaced, additive: models that do not select
it are unaffected), the attention and mask functions, the transformers implementation that picks it when a saved
patched model is loaded (``attn_implementation="sdpa"``), and the implementation the unpatched base model runs.
Registration, ``get_patch``'s report of the backend running, loading with ``attn_implementation=`` and the error
for a name with no counterpart all read these tables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

from .extension import extension_eager_attention, extension_mask, temperature_attention
from .extension_blocks import extension_blocked_attention, extension_sdpa_attention
from .extension_flex import extension_flex_attention
from .functions import alibi_cudnn_attention, alibi_eager_attention, alibi_flex_attention, alibi_sdpa_attention
from .masks import alibi_distance_mask, alibi_flex_mask, alibi_prefill_mask
from .t5 import t5_eager_attention, t5_flex_attention, t5_sdpa_attention


@dataclass(frozen=True)
class Backend:
    """One attention backend.

    Attributes:
        name (`str`): what a method's ``backend`` parameter says (``"sdpa"``).
        implementation (`str`): the name registered with transformers (``"hf_posenc_alibi_sdpa"``).
        attention (`Callable`): the attention function.
        mask (`Callable`): the mask function registered beside it.
        stands_for (`str`, *optional*): the transformers implementation that selects it when a saved patched model
            is loaded (``"flex_attention"`` for ``flex``); None: only its own name does.
        base (`str`): the implementation the unpatched base model runs, what ``unpatch`` gives back after loading.
    """

    name: str
    implementation: str
    attention: Callable
    mask: Callable
    stands_for: str | None
    base: str


@dataclass(frozen=True)
class BackendTable:
    """The backends of one family of attention functions, in the order of preference they are listed."""

    family: str
    backends: tuple[Backend, ...]

    def __getitem__(self, name: str) -> Backend:
        return next(backend for backend in self.backends if backend.name == name)

    def __contains__(self, name: str) -> bool:
        return any(backend.name == name for backend in self.backends)

    @property
    def names(self) -> list[str]:
        return [backend.name for backend in self.backends]

    @property
    def implementations(self) -> list[str]:
        """The registered implementation names."""
        return [backend.implementation for backend in self.backends]

    @property
    def standard_names(self) -> list[str]:
        """The transformers implementations that select one of these backends at load."""
        return [backend.stands_for for backend in self.backends if backend.stands_for is not None]

    def implementation(self, name: str) -> str:
        """The registered name of the backend ``name``."""
        return self[name].implementation

    def backend_of(self, implementation: str | None) -> str | None:
        """The backend registered as ``implementation``, or None for a name not of this family."""
        return next((backend.name for backend in self.backends if backend.implementation == implementation), None)

    def for_loading(self, attn_implementation: str) -> Backend | None:
        """The backend that ``attn_implementation`` asked for at load selects: a transformers name it stands for,
        or its own registered name; None where it has no counterpart here."""
        for backend in self.backends:
            if attn_implementation in (backend.stands_for, backend.implementation):
                return backend
        return None


def _row(family: str, name: str, attention: Callable, mask: Callable, stands_for: str | None) -> Backend:
    base = "eager" if name == "eager" else "sdpa"  # GPT-2 has no flex_attention: the base runs SDPA under flex
    return Backend(name, f"hf_posenc_{family}_{name}", attention, mask, stands_for, base)


ALIBI = BackendTable(
    "alibi",
    (
        _row("alibi", "eager", alibi_eager_attention, alibi_distance_mask, "eager"),
        _row("alibi", "sdpa", alibi_sdpa_attention, alibi_distance_mask, "sdpa"),
        _row("alibi", "flex", alibi_flex_attention, alibi_flex_mask, "flex_attention"),
        _row("alibi", "cudnn", alibi_cudnn_attention, alibi_prefill_mask, None),
    ),
)
T5 = BackendTable(  # the masks are ALiBi's: they carry the positions
    "t5",
    (
        _row("t5", "eager", t5_eager_attention, alibi_distance_mask, "eager"),
        _row("t5", "sdpa", t5_sdpa_attention, alibi_distance_mask, "sdpa"),
        _row("t5", "flex", t5_flex_attention, alibi_flex_mask, "flex_attention"),
    ),
)
REMAP = BackendTable(  # Self-Extend and DCA, with log-n where combined
    "extension",
    (
        _row("extension", "eager", extension_eager_attention, extension_mask, "eager"),
        _row("extension", "blocked", extension_blocked_attention, extension_mask, None),
        _row("extension", "sdpa", extension_sdpa_attention, extension_mask, "sdpa"),
        _row("extension", "flex", extension_flex_attention, extension_mask, "flex_attention"),
    ),
)
# log-n alone wraps the model's own implementation: a row per implementation it wraps, with that one's masks
TEMPERATURE = BackendTable(
    "logn",
    tuple(
        Backend(
            base, f"hf_posenc_logn_{base}", temperature_attention(base), ALL_MASK_ATTENTION_FUNCTIONS[base], base, base
        )
        for base in ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3")
    ),
)
TABLES = (ALIBI, T5, REMAP, TEMPERATURE)
