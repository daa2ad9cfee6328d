"""Which parameters train: all of them, or only the position encoding's (what the patch added) and the norms',
with LoRA adapters or without; and a model loaded from a GGUF file made trainable (:func:`release_gguf`).

A method that replaces the position encoding (``alibi``, ``nope``, ``t5-bias``) changes what every layer sees;
``trainable="position"`` lets the model adapt only through the position parameters as patched (what the patch
added, ``t5-bias``'s bucket table; or GPT-2's table as ``pi`` interpolated it) and its normalisation weights
(the cheapest place to rescale activations), and keeps every other weight bit for bit. ``trainable="lora"`` trains
those and LoRA adapters on every linear layer (:mod:`hf_posenc.training.lora`), merged into the weights at the end.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from torch import nn
from transformers import PreTrainedModel
from transformers.utils.quantization_config import QuantizationMethod

from ..architectures import position_table, positions_of
from ..hub.saved import restore_saved_tensors, saved_tensors
from ..patching import added_tensors, get_patch, patch
from ..registry import get_method
from ..spec import MethodSpec
from .lora import is_adapter
from .settings import TRAINABLE

logger = logging.getLogger(__name__)


def apply_method(model: nn.Module, spec: MethodSpec) -> frozenset[str]:
    """Patch ``model`` with ``spec`` (nothing for ``none``) and return the names of its position parameters as
    patched: those the patch added (``t5-bias``'s table), or the learned table it interpolated (``pi`` on GPT-2).

    Raises:
        ValueError: ``model`` is patched already (pass the base model: the method is applied here, so that
            what it adds is known).
    """
    applied = get_patch(model)
    if applied is not None:
        raise ValueError(
            f"`model` is already patched with {applied.method!r}; pass the unpatched model (hf_posenc.unpatch) and "
            f"the method as `method`, so that training knows which parameters the patch adds."
        )
    if spec.unpatched:
        return frozenset()
    patch(model, spec.name, **spec.params)
    saved = saved_tensors(model)  # a saved model's trained T5 table: kept where the method and parameters are its own
    if not restore_saved_tensors(model) and saved:
        logger.warning(
            "The model was saved with trained %s of another method or parameters than %s: they are not used, and "
            "training starts from the patch's own values.",
            ", ".join(sorted(saved)),
            spec.text,
        )
    added = set(added_tensors(model)).intersection(dict(model.named_parameters()))
    if get_method(spec.method).role != "replace" and positions_of(model).kind == "learned":
        added |= _table_parameter(model)  # GPT-2's table, interpolated by pi: the position encoding as patched
    return frozenset(added)


def is_norm(model: nn.Module, name: str) -> bool:
    """Whether the parameter ``name`` is a normalisation weight: its module's class name ends with ``Norm``
    (``LayerNorm``, ``LlamaRMSNorm``), or a part of its name starts with ``ln_`` or holds ``norm`` (GPT-2's
    ``ln_f``, ``input_layernorm``)."""
    module_name, _, _ = name.rpartition(".")
    module = model.get_submodule(module_name)
    parts = module_name.lower().split(".")
    return type(module).__name__.endswith("Norm") or any(p.startswith("ln_") or "norm" in p for p in parts)


def unused_parameters(model: nn.Module) -> frozenset[str]:
    """Parameters a patch left in the model unused: the learned position table a method replaced on GPT-2 (kept so
    the checkpoint stays whole). They get no gradient, so they do not train (DDP would wait for their gradient)."""
    applied = get_patch(model)
    if applied is None or get_method(applied.method).role != "replace" or positions_of(model).kind != "learned":
        return frozenset()
    return _table_parameter(model)


def _table_parameter(model: nn.Module) -> frozenset[str]:
    """The name of the learned position table's weight (GPT-2's ``transformer.wpe.weight``)."""
    table = position_table(model).weight
    return frozenset(name for name, parameter in model.named_parameters() if parameter is table)


def select_trainable(
    model: nn.Module, trainable: str, added: Collection[str] = (), unused: Collection[str] = ()
) -> int:
    """Set ``requires_grad`` on every parameter of ``model`` and return how many values will train.

    Args:
        model (`torch.nn.Module`): the (patched) model.
        trainable (`str`): ``"all"``; ``"position"``: the parameters named in ``added`` and every normalisation
            weight (:func:`is_norm`), all others get ``requires_grad=False``; ``"lora"``: those and the LoRA
            adapters (:func:`~hf_posenc.training.lora.add_adapters` first).
        added (`Collection[str]`): names of the position parameters as patched (:func:`apply_method`).
        unused (`Collection[str]`): names of parameters that never train (:func:`unused_parameters`).

    Raises:
        ValueError: unknown ``trainable``, or nothing selected.
    """
    if trainable not in TRAINABLE:
        raise ValueError(f"Unknown `trainable` {trainable!r}; choose one of {', '.join(TRAINABLE)}.")
    count = 0
    for name, parameter in model.named_parameters():
        adapter = trainable == "lora" and is_adapter(name)
        chosen = trainable == "all" or adapter or name in added or is_norm(model, name)
        parameter.requires_grad_(chosen and name not in unused)
        count += parameter.numel() if parameter.requires_grad else 0
    if count == 0:
        raise ValueError(
            f"`trainable` {trainable!r} selects no parameter of {type(model).__name__}: the patch added none and no "
            "module is a normalisation layer. Use `trainable` 'all'."
        )
    return count


def release_gguf(model: PreTrainedModel) -> None:
    """Make a model loaded with ``from_pretrained(..., gguf_file=...)`` an ordinary model that trains and saves.

    transformers loads a GGUF through its GGUF quantizer and marks the model quantized (``model.hf_quantizer``,
    ``model.is_quantized``, ``model.quantization_method``, ``config.quantization_config``, ``config._is_quantized``)
    even where it unpacked every weight into float tensors (always, unless the ``kernels`` package serves the
    packed blocks). With the marks, ``Trainer`` refuses the model ("purely quantized models") and
    ``save_pretrained`` refuses to save it ("quantized with gguf and is not serializable"). When every parameter is
    a float tensor, the marks are cleared here (the quantizer's own ``remove_quantization_config``), so the model
    trains and saves as safetensors like any other. Other models are left as they are.

    Raises:
        ValueError: some weights are still packed GGUF blocks.
    """
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None or quantizer.quantization_config.quant_method != QuantizationMethod.GGUF:
        return
    packed = [name for name, parameter in model.named_parameters() if not parameter.is_floating_point()]
    if packed:
        raise ValueError(
            f"`model` keeps {len(packed)} weights as packed GGUF blocks ({packed[0]}, ...), which cannot train; load "
            "it with quantization_config=GgufConfig(dequantize=True) (transformers), or without the kernels package."
        )
    quantizer.remove_quantization_config(model)
    for module in model.modules():
        if isinstance(module, PreTrainedModel) and hasattr(module.config, "_is_quantized"):
            del module.config._is_quantized
