"""LoRA adapters for ``trainable="lora"`` (Hu et al. 2021, arXiv 2106.09685: ``W + (α/r)·B·A``, ``B`` zero at first).

The adapters are put into the model itself (peft's ``inject_adapter_in_model``), not into a ``PeftModel`` wrapper:
the Trainer then checkpoints every weight the run trains, the position parameters and norms beside the adapters
(a ``PeftModel`` checkpoint holds its adapters alone), so a killed run resumes bit for bit as any other. At the end
the adapters are merged into the weights (:func:`merge_adapters`), and the saved model is an ordinary patched one.
peft is an optional dependency (``pip install 'hf-posenc[lora]'``).
"""

from __future__ import annotations

import torch
from torch import nn

from ..patching.wrappers import adapter_layers

ADAPTER_TAG = ".lora_"  # in the names of the adapters' parameters (``...q_proj.lora_A.default.weight``)


def adapted_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The layers :func:`add_adapters` adapts, by name: every linear layer (GPT-2's ``Conv1D`` too) but the output
    layer, as peft's ``"all-linear"`` picks them."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return {
        name: module
        for name, module in model.named_modules()
        if type(module).__name__ in ("Linear", "Conv1D") and module is not head
    }


def check_rank(model: nn.Module, rank: int) -> None:
    """Raise ``ValueError`` if ``rank`` is more than the smaller side of a layer the adapters adapt: past it,
    ``B A`` cannot have rank ``r``."""
    sides = [(min(layer.weight.shape), name) for name, layer in adapted_layers(model).items()]
    if sides and rank > min(sides)[0]:
        smallest, name = min(sides)
        raise ValueError(
            f"`lora_rank` {rank} is more than the smaller side of the layer {name} ({smallest}), which its adapters "
            f"could not reach; give at most {smallest}."
        )


def add_adapters(model: nn.Module, rank: int, alpha: float, seed: int) -> None:
    """Put LoRA adapters of ``rank`` and scale ``alpha / rank`` on every linear layer of ``model`` but its output
    layer (peft's ``"all-linear"``: :func:`adapted_layers`), ``A`` initialised from ``seed`` (the global RNG left as
    it was)."""
    from peft import LoraConfig, inject_adapter_in_model

    transposed = any(type(module).__name__ == "Conv1D" for module in model.modules())  # GPT-2's (in, out) weights
    config = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules="all-linear", fan_in_fan_out=transposed
    )
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        inject_adapter_in_model(config, model)


def is_adapter(name: str) -> bool:
    """Whether the parameter ``name`` is a LoRA adapter's."""
    return ADAPTER_TAG in name


def merge_adapters(model: nn.Module) -> int:
    """Merge every LoRA adapter of ``model`` into the weight it adapts and put that layer back in its place, so the
    model's modules and state-dict names are those it had before :func:`add_adapters`. Returns the layers merged."""
    return _put_back_layers(model, merge=True)


def remove_adapters(model: nn.Module) -> int:
    """Put back every layer LoRA adapts in ``model``, unchanged, its adapters dropped (a run stopped before the
    Trainer ran). Returns the layers put back."""
    return _put_back_layers(model, merge=False)


def _put_back_layers(model: nn.Module, merge: bool) -> int:
    layers = [(name, model.get_submodule(name)) for name in adapter_layers(model)]
    for name, module in layers:
        if merge:
            with torch.no_grad():
                module.merge()
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, module.get_base_layer())
    if layers:
        vars(model).pop("peft_config", None)  # inject_adapter_in_model's, of adapters the model no longer has
    return len(layers)
