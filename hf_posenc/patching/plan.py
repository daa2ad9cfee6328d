"""What a patch is before it touches the model, and what a planner is.

A planner (one module per kind of change: :mod:`~hf_posenc.patching.rope`, :mod:`~hf_posenc.patching.bias`,
:mod:`~hf_posenc.patching.learned`) validates everything and returns a :class:`Plan`; only
:mod:`hf_posenc.patching.apply` applies it, recording each config attribute and each changed module
first so that ``unpatch`` restores them exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..registry import Method

UNPATCHED_PREFIX = "hf_posenc_unpatched_"
"""A tensor a patch replaces on a module stays there, until ``unpatch``, as the non-persistent buffer of this
prefix and its name: every later ``model.to`` / ``.half()`` moves and casts it as it would the unpatched model's."""


def unpatched_tensor(module: nn.Module, name: str) -> torch.Tensor:
    """The tensor ``name`` of ``module`` as the unpatched model would hold it now (:data:`UNPATCHED_PREFIX`)."""
    return module._buffers[UNPATCHED_PREFIX + name]


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


ModuleChange = Callable[[nn.Module], None]


@dataclass
class Plan:
    """A validated patch.

    Attributes:
        info (`PatchInfo`): what ``get_patch`` will report.
        updates (`dict`): config attribute -> new value, set before the module changes run.
        changes (`list`): ``(module, change)``; ``change(module)`` runs after the config updates and may
            set any attribute, buffer, parameter or forward of that module instance (never its class).
        report (`Callable`, *optional*): ``report(model, info) -> PatchInfo``: what ``get_patch`` says later,
            where it depends on the model's state then (ALiBi: the backend running now). None: ``info``.
        attention (`str`, *optional*): the attention implementation the patch selects, through transformers'
            ``model.set_attn_implementation`` after the config updates; None: the model's stays.
    """

    info: PatchInfo
    updates: dict[str, Any]
    changes: list[tuple[nn.Module, ModuleChange]] = field(default_factory=list)
    report: Callable[[nn.Module, PatchInfo], PatchInfo] | None = None
    attention: str | None = None


@dataclass(frozen=True)
class Planner:
    """One kind of change: the methods and position kinds it serves, how it plans, what loading needs.

    Attributes:
        positions (`frozenset[str]`): the position kinds it patches (``"rope"``, ``"learned"``).
        serves (`Callable`): ``serves(method) -> bool``.
        plan (`Callable`): ``plan(model, method, params) -> Plan``; validates and changes nothing.
        loading (`Callable`, *optional*): ``loading(params, kwargs) -> (params, kwargs)``: what loading a saved
            model patched with such a method changes in the recorded parameters and in the keyword arguments
            that build the base model (ALiBi: ``attn_implementation`` picks its backend). None: nothing.
    """

    positions: frozenset[str]
    serves: Callable[[Method], bool]
    plan: Callable[[nn.Module, Method, dict[str, Any]], Plan]
    loading: Callable[[dict[str, Any], dict[str, Any]], tuple[dict[str, Any], dict[str, Any]]] | None = None
