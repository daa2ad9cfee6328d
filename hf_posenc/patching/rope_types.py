"""A RoPE method in a config's ``rope_parameters``, and hf_posenc's own rope types.

A patch writes the method into ``config.rope_parameters``: in transformers' own vocabulary where it
can say it (``linear``, ``dynamic``, ``yarn``, ``llama3``, ``longrope``, or ``default`` with a larger
``rope_theta`` for static NTK), so a saved model loads the same without hf_posenc; otherwise under
hf_posenc's rope types, which plain transformers refuses to build (``KeyError: 'hf_posenc'``) instead
of loading the unscaled model. :mod:`hf_posenc.patching.registrations` gives transformers :func:`own_rope_init`
for those types.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ..architectures import rotary_dim
from ..methods import rope_frequencies
from ..methods._common import rope_inv_freq
from ..record import CONFIG_KEY, PatchRecord
from ..registry import Method, available_methods, get_method, params_to_dict

OWN_ROPE_TYPE = "hf_posenc"
OWN_DYNAMIC_ROPE_TYPE = "hf_posenc_dynamic"  # contains "dynamic": transformers recomputes it per length
# Self-Extend, DCA, log-n and their combinations: the rotation is the base's (or the combined RoPE scaling's, whose
# parameters stay beside it), the change is in attention; no init function either, so plain transformers refuses.
EXTENSION_ROPE_TYPE = "hf_posenc_extension"


def replaced_marker(method: Method) -> str:
    """What a method that replaces the encoding (ALiBi, NoPE, the T5 bias) writes as the ``rope_type`` of a RoPE
    model (GPT-2: as its ``activation_function``): ``hf_posenc_<name>``. It has no init function (activation), so
    plain transformers refuses the saved config rather than build the model with its original encoding."""
    return "hf_posenc_" + method.name.replace("-", "_")


REPLACED_ROPE_TYPES = tuple(
    replaced_marker(get_method(name))
    for name in available_methods()
    if get_method(name).role == "replace" and "rope" in get_method(name).applies_to
)
OWN_ROPE_TYPES = (OWN_ROPE_TYPE, OWN_DYNAMIC_ROPE_TYPE, EXTENSION_ROPE_TYPE, *REPLACED_ROPE_TYPES)
_OWN_KEYS = ("rope_type", "rope_theta", "partial_rotary_factor", "method")


def _base_rope_fields(rope_parameters: dict[str, Any]) -> dict[str, Any]:
    return {k: rope_parameters[k] for k in ("rope_theta", "partial_rotary_factor") if k in rope_parameters}


def native_rope_parameters(method: Method, params: Any, config: Any) -> dict[str, Any] | None:
    """``rope_parameters`` in transformers' vocabulary for this patch, or None if it has no such type.

    Args:
        method (`Method`): the RoPE method patched in.
        params (`Any`): its built parameters.
        config (`Any`): the model's config, unpatched: its rotary dimension, ``rope_theta`` and
            ``partial_rotary_factor``.
    """
    if method.transformers_rope is None:
        return None
    rope = method.transformers_rope(params, rotary_dim(config), config.rope_parameters["rope_theta"])
    return None if rope is None else {**_base_rope_fields(config.rope_parameters), **rope}


def own_rope_parameters(method: Method, params: Any, config: Any) -> dict[str, Any]:
    """``rope_parameters`` under hf_posenc's own rope type (methods transformers cannot express):
    ``hf_posenc_dynamic`` for a dynamic method, else ``hf_posenc``, with the method's name and parameters.

    Args:
        method (`Method`): the RoPE method patched in.
        params (`Any`): its built parameters.
        config (`Any`): the model's config, unpatched: its ``rope_theta`` and ``partial_rotary_factor``.
    """
    rope_type = OWN_DYNAMIC_ROPE_TYPE if method.dynamic else OWN_ROPE_TYPE
    return {
        "rope_type": rope_type,
        **_base_rope_fields(config.rope_parameters),
        "method": method.name,
        **params_to_dict(params),
    }


TOP_LEVEL_ORIGINAL = "original_max_position_embeddings"


def rope_config_updates(method: Method, params: Any, config: Any, rope_parameters: dict[str, Any]) -> dict[str, Any]:
    """New values of the config attributes a RoPE patch sets (``rope_parameters``, ``max_position_embeddings``,
    the record). Methods with a ``factor`` announce the extended context ``round(s * L)`` (LongRoPE too, as Phi-3
    configs do: vLLM, SGLang and TGI take its attention factor and long table from ``max_position_embeddings / L``);
    a rope type that contains ``dynamic`` keeps ``L`` there, which transformers' dynamic update reads as the
    trained context.

    Args:
        method (`Method`): the RoPE method patched in.
        params (`Any`): its built parameters, the trained context ``L`` resolved.
        config (`Any`): the model's config, unpatched: the record keeps the values replaced.
        rope_parameters (`dict[str, Any]`): the new ``rope_parameters`` (:func:`native_rope_parameters` or
            :func:`own_rope_parameters`).

    Returns:
        `dict[str, Any]`: config attribute -> new value, the patch record included.
    """
    context = params.context
    factor = getattr(params, "factor", None)
    keeps_context = "dynamic" in rope_parameters["rope_type"] or factor is None
    max_positions = context if keeps_context else round(factor * context)
    native = rope_parameters["rope_type"] not in OWN_ROPE_TYPES
    updates = {"rope_parameters": rope_parameters, "max_position_embeddings": max_positions}
    if TOP_LEVEL_ORIGINAL in config.__dict__ and TOP_LEVEL_ORIGINAL in rope_parameters:
        # Phi-3's class keeps L at the top level too (4096 unless set), and transformers reads it there first
        updates[TOP_LEVEL_ORIGINAL] = rope_parameters[TOP_LEVEL_ORIGINAL]
    base = {key: getattr(config, key) for key in updates}
    record = PatchRecord(method.name, params_to_dict(params), native, base)
    return {**updates, CONFIG_KEY: record.to_dict()}


def transformers_frequencies(
    config: Any, rotary_class: type, seq_len: int | None = None, device: Any = None
) -> tuple[torch.Tensor, float]:
    """What transformers itself computes for ``config.rope_parameters`` (float32).

    ``seq_len`` goes in as a 0-d int64 tensor, as transformers' dynamic update passes it, so the
    arithmetic (and so every bit of the result) is the one a natively loaded model does.

    Args:
        config (`Any`): a config whose ``rope_parameters`` hold one of transformers' rope types.
        rotary_class (`type`): the model's rotary embedding class (its ``compute_default_rope_parameters`` serves
            ``default``).
        seq_len (`int`, *optional*): the current length, for the dynamic types.
        device (*optional*): where the frequencies are made.

    Returns:
        `tuple[torch.Tensor, float]`: ``inv_freq`` and the attention factor.
    """
    rope_type = config.rope_parameters["rope_type"]
    if rope_type == "default":
        inv_freq, factor = rotary_class.compute_default_rope_parameters(config)
        return inv_freq.to(device), factor
    length = None if seq_len is None else torch.tensor(seq_len, device=device)
    return ROPE_INIT_FUNCTIONS[rope_type](config, device, seq_len=length)


def own_rope_init(config: Any, device: Any = None, seq_len: Any = None, layer_type: Any = None):
    """transformers rope-init function for hf_posenc's rope types (``ROPE_INIT_FUNCTIONS`` signature): the
    float32 ``inv_freq`` and attention factor of the method a config carries.

    Reads the patch record when the config has one (a patched model whose rotary modules transformers
    re-initializes), else the method written into ``rope_parameters`` (a saved config loaded by plain
    transformers after ``import hf_posenc``). A patch without rotation (ALiBi) gives zero frequencies: the
    identity rotation it installed; a combination (``"yarn+logn"``) its RoPE scaling's frequencies; an
    attention-level method alone the base's.

    Args:
        config (`Any`): the model's config.
        device (*optional*): where the frequencies are made.
        seq_len (*optional*): the current length, for a dynamic method (an int or a 0-d tensor).
        layer_type (*optional*): not read; part of the ``ROPE_INIT_FUNCTIONS`` signature.

    Raises:
        ValueError: an unknown method, a bad parameter, or a malformed patch record.
    """
    record = PatchRecord.from_config(config, missing_ok=True)
    if record:
        method = get_method(record.method)
        method = method.part("rope") or method  # a combination's RoPE scaling
        base = record.base["rope_parameters"]["rope_theta"]
        if method.role == "replace":  # ALiBi, NoPE, the T5 bias: no rotation
            return torch.zeros(rotary_dim(config) // 2, device=device), 1.0
        if method.frequencies is None:  # Self-Extend, DCA, log-n alone: the base's rotation
            return rope_inv_freq(rotary_dim(config), base, dtype=torch.float32, device=device), 1.0
        method, params = method.name, method.own(record.params)
    else:
        rope = config.rope_parameters
        method, base = rope["method"], rope["rope_theta"]
        params = {key: value for key, value in rope.items() if key not in _OWN_KEYS}
    inv_freq, attention = rope_frequencies(
        method,
        head_dim=rotary_dim(config),
        base=base,
        seq_len=None if seq_len is None else int(seq_len),
        **params,
    )
    return inv_freq.to(device=device, dtype=torch.float32), attention
