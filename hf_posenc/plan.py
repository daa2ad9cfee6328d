"""What a patch is before it touches the model: the config attributes it sets and the module changes.

A planner (one per kind of position encoding and method, see :mod:`hf_posenc.patching`) validates
everything and returns a :class:`Plan`; only :func:`hf_posenc.patching.patch` applies it, recording each
config attribute and each changed module first so that ``unpatch`` restores them exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn


@dataclass(frozen=True)
class PatchInfo:
    """What :func:`hf_posenc.get_patch` reports.

    Attributes:
        method (`str`): canonical method name.
        params (`dict`): every parameter, defaults, the trained context and (ALiBi) the backend resolved.
        native (`bool`): the config says it in transformers' own vocabulary (loads without hf_posenc).
        rope_type (`str`, *optional*): the ``rope_type`` written to ``config.rope_parameters``; ``None`` for
            models without RoPE.
    """

    method: str
    params: dict[str, Any]
    native: bool
    rope_type: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "params": dict(self.params), "native": self.native, "rope_type": self.rope_type}


ModuleChange = Callable[[nn.Module], None]


@dataclass
class Plan:
    """A validated patch.

    Attributes:
        info (`PatchInfo`): what ``get_patch`` will report.
        updates (`dict`): config attribute -> new value, set before the module changes run.
        changes (`list`): ``(module, change)``; ``change(module)`` runs after the config updates and may
            set any attribute, buffer, parameter or forward of that module instance (never its class).
    """

    info: PatchInfo
    updates: dict[str, Any]
    changes: list[tuple[nn.Module, ModuleChange]] = field(default_factory=list)
