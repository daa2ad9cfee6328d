"""The transformers model inside the wrappers a user may hand to ``patch`` (peft, ``torch.compile``, data parallel),
and the hooks accelerate puts on its modules.

A wrapper forwards ``config`` and holds the model's modules, so a patch of the wrapper would change the right
modules but keep its record on the wrapper: after peft's ``merge_and_unload()`` the model would be patched with no
record to unpatch it from. The record belongs on the model the wrapper wraps.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel


def unwrapped(model: nn.Module) -> nn.Module:
    """The model ``model`` wraps, through any number of wrappers: a peft ``PeftModel`` (``get_base_model()``) or
    tuner (``LoraModel``, a ``PeftModel``'s ``base_model``: ``model``), a module ``torch.compile`` wraps
    (``_orig_mod``), ``DistributedDataParallel`` or ``DataParallel`` (``module``); ``model`` itself when it wraps
    none."""
    while isinstance(model, nn.Module) and not isinstance(model, PreTrainedModel):
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            inner = model.module
        elif "_orig_mod" in model._modules:
            inner = model._modules["_orig_mod"]
        elif callable(getattr(type(model), "get_base_model", None)):
            inner = model.get_base_model()
        elif _is_peft(model, "BaseTuner"):
            inner = model._modules.get("model")
        else:
            return model
        if not isinstance(inner, nn.Module) or inner is model:
            return model
        model = inner
    return model


def adapter_layers(model: nn.Module) -> list[str]:
    """The names of the modules of ``model`` that are peft adapter layers (a LoRA layer holds the layer it adapts
    as ``base_layer`` and its adapters beside it: saved, its weights have other names than the model's)."""
    return [name for name, module in model.named_modules() if _is_peft(module, "BaseTunerLayer")]


def _is_peft(module: nn.Module, class_name: str) -> bool:
    """Whether ``module`` is an instance of peft's class ``class_name`` (peft not imported here: it is optional)."""
    return any(cls.__name__ == class_name and cls.__module__.startswith("peft.") for cls in type(module).__mro__)


def accelerate_hooks(module: nn.Module) -> list[Any]:
    """The hooks accelerate put on ``module`` (a ``device_map``'s placement and offload), each apart: a
    SequentialHook holds several; none: empty."""
    hook = getattr(module, "_hf_hook", None)
    return [] if hook is None else list(getattr(hook, "hooks", None) or [hook])


def offloaded_values(model: nn.Module, name: str) -> torch.Tensor:
    """The values of the meta tensor ``name`` of ``model``, from the ``weights_map`` of accelerate's hook on its
    module (CPU or disk offload: the offload folder's file mapped, not loaded whole)."""
    module_name, _, key = name.rpartition(".")
    for each in accelerate_hooks(model.get_submodule(module_name)):
        weights = getattr(each, "weights_map", None)
        if weights is not None and key in weights:
            return weights[key]
    raise ValueError(
        f"{name} of {type(model).__name__} is on the meta device with its values nowhere (a model built on the "
        "meta device, not loaded): its values cannot be read."
    )
