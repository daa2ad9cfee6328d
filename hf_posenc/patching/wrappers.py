"""The transformers model inside the wrappers a user may hand to ``patch``: peft, ``torch.compile``, data parallel.

A wrapper forwards ``config`` and holds the model's modules, so a patch of the wrapper would change the right
modules but keep its record on the wrapper: after peft's ``merge_and_unload()`` the model would be patched with no
record to unpatch it from. The record belongs on the model the wrapper wraps.
"""

from __future__ import annotations

from torch import nn
from transformers import PreTrainedModel


def unwrapped(model: nn.Module) -> nn.Module:
    """The model ``model`` wraps, through any number of wrappers: a peft ``PeftModel`` (``get_base_model()``), a
    module ``torch.compile`` wraps (``_orig_mod``), ``DistributedDataParallel`` or ``DataParallel`` (``module``);
    ``model`` itself when it wraps none."""
    while isinstance(model, nn.Module) and not isinstance(model, PreTrainedModel):
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            inner = model.module
        elif "_orig_mod" in model._modules:
            inner = model._modules["_orig_mod"]
        elif callable(getattr(type(model), "get_base_model", None)):
            inner = model.get_base_model()
        else:
            return model
        if not isinstance(inner, nn.Module) or inner is model:
            return model
        model = inner
    return model
