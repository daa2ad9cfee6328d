"""Method <-> model config.

A patch writes the method into ``config.rope_parameters``: in transformers' own vocabulary where it
can say it (``linear``, ``dynamic``, ``yarn``, ``llama3``, ``longrope``, or ``default`` with a larger
``rope_theta`` for static NTK), so a saved model loads the same without hf_posenc; otherwise under
hf_posenc's rope types, which plain transformers refuses to build (``KeyError: 'hf_posenc'``) instead
of loading the unscaled model. ``config.hf_posenc`` records the method, its resolved parameters and
the base model's values, so ``unpatch`` and ``from_pretrained`` can undo and redo the patch.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, RotaryEmbeddingConfigMixin

from . import __version__
from .architectures import rotary_dim
from .methods import rope_frequencies
from .registry import Method, get_method

CONFIG_KEY = "hf_posenc"
OWN_ROPE_TYPE = "hf_posenc"
OWN_DYNAMIC_ROPE_TYPE = "hf_posenc_dynamic"  # contains "dynamic": transformers recomputes it per length
ALIBI_ROPE_TYPE = "hf_posenc_alibi"  # no rotation; no init function, so plain transformers refuses the config
_OWN_KEYS = ("rope_type", "rope_theta", "partial_rotary_factor", "method")


def params_to_dict(params: Any) -> dict[str, Any]:
    """A params dataclass as JSON-ready values (tuples become lists)."""
    return {
        key: list(value) if isinstance(value, tuple) else value for key, value in dataclasses.asdict(params).items()
    }


def _base_rope_fields(rope_parameters: dict[str, Any]) -> dict[str, Any]:
    return {k: rope_parameters[k] for k in ("rope_theta", "partial_rotary_factor") if k in rope_parameters}


def native_rope_parameters(method: Method, params: Any, config: Any) -> dict[str, Any] | None:
    """``rope_parameters`` in transformers' vocabulary for this patch, or None if it has no such type."""
    native = method.native(params, rotary_dim(config), config.rope_parameters["rope_theta"])
    if native is None:
        return None
    return {**_base_rope_fields(config.rope_parameters), **native}


def own_rope_parameters(method: Method, params: Any, config: Any) -> dict[str, Any]:
    """``rope_parameters`` under hf_posenc's own rope type (methods transformers cannot express)."""
    rope_type = OWN_DYNAMIC_ROPE_TYPE if method.dynamic else OWN_ROPE_TYPE
    return {
        "rope_type": rope_type,
        **_base_rope_fields(config.rope_parameters),
        "method": method.name,
        **params_to_dict(params),
    }


def patch_record(
    method: str, params: dict[str, Any], native: bool, base: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    """The ``config.hf_posenc`` record: the method, its resolved parameters and the base values of every
    config attribute the patch changed (what :func:`split_patched_config` puts back)."""
    return {
        "method": method,
        "params": params,
        "native": native,
        "base": copy.deepcopy(base),
        **extra,
        "version": __version__,
    }


def config_updates(method: Method, params: Any, config: Any, rope_parameters: dict[str, Any]) -> dict[str, Any]:
    """New values of the config attributes a patch sets (``rope_parameters``, ``max_position_embeddings``,
    ``hf_posenc``). Static methods announce the extended context ``round(s * L)``; dynamic ones keep
    ``L`` there, which transformers' ``dynamic`` type reads as the trained context."""
    context = params.context
    factor = getattr(params, "factor", None)
    max_positions = context if method.dynamic or factor is None else round(factor * context)
    native = rope_parameters["rope_type"] not in (OWN_ROPE_TYPE, OWN_DYNAMIC_ROPE_TYPE)
    base = {"rope_parameters": config.rope_parameters, "max_position_embeddings": config.max_position_embeddings}
    return {
        "rope_parameters": rope_parameters,
        "max_position_embeddings": max_positions,
        CONFIG_KEY: patch_record(method.name, params_to_dict(params), native, base),
    }


def transformers_frequencies(
    config: Any, rotary_class: type, seq_len: int | None = None, device: Any = None
) -> tuple[torch.Tensor, float]:
    """What transformers itself computes for ``config.rope_parameters`` (float32).

    ``seq_len`` goes in as a 0-d int64 tensor, as transformers' dynamic update passes it, so the
    arithmetic (and so every bit of the result) is the one a natively loaded model does.
    """
    rope_type = config.rope_parameters["rope_type"]
    if rope_type == "default":
        inv_freq, factor = rotary_class.compute_default_rope_parameters(config)
        return inv_freq.to(device), factor
    length = None if seq_len is None else torch.tensor(seq_len, device=device)
    return ROPE_INIT_FUNCTIONS[rope_type](config, device, seq_len=length)


def own_rope_init(config: Any, device: Any = None, seq_len: Any = None, layer_type: Any = None):
    """transformers rope-init function for hf_posenc's rope types (``ROPE_INIT_FUNCTIONS`` signature).

    Reads the ``hf_posenc`` record when the config has one (a patched model whose rotary modules
    transformers re-initializes), else the method written into ``rope_parameters``. A patch without
    rotation (ALiBi) gives zero frequencies: the identity rotation it installed.
    """
    record = getattr(config, CONFIG_KEY, None)
    if record and get_method(record["method"]).frequencies is None:
        return torch.zeros(rotary_dim(config) // 2, device=device), 1.0
    if record:
        method, params = record["method"], record["params"]
        base = record["base"]["rope_parameters"]["rope_theta"]
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


def _validate_own_rope_parameters(config: Any, rope_parameters: dict[str, Any], ignore_keys: Any = None) -> None:
    """transformers' config validation for hf_posenc's rope types: a method written into ``rope_parameters``
    must be one hf_posenc knows (ALiBi's type names none: the base parameters are kept as they were)."""
    if "method" in rope_parameters:
        get_method(rope_parameters["method"])


# Namespaced and additive: harmless for models that do not use these rope types. ALiBi gets a validation
# (a config that says it loads without a warning) but no init function: plain transformers must not build it.
ROPE_INIT_FUNCTIONS.setdefault(OWN_ROPE_TYPE, own_rope_init)
ROPE_INIT_FUNCTIONS.setdefault(OWN_DYNAMIC_ROPE_TYPE, own_rope_init)
for _rope_type in (OWN_ROPE_TYPE, OWN_DYNAMIC_ROPE_TYPE, ALIBI_ROPE_TYPE):
    if not hasattr(RotaryEmbeddingConfigMixin, f"_validate_{_rope_type}_rope_parameters"):
        setattr(RotaryEmbeddingConfigMixin, f"_validate_{_rope_type}_rope_parameters", _validate_own_rope_parameters)


def split_patched_config(config: Any) -> tuple[Any, str | None, dict[str, Any]]:
    """``(base_config, method, params)``: a copy of ``config`` with any hf_posenc patch undone, and the
    patch it carried (``(copy, None, {})`` for an unpatched config).

    A ``baked`` record (GPT-2 ``pi``: the resampled table is in the weights, the config is plain
    transformers) describes the model as saved: it loads as is, with nothing to redo.
    """
    base = copy.deepcopy(config)
    record = getattr(base, CONFIG_KEY, None)
    if not record or record.get("baked"):
        return base, None, {}
    for key, value in record["base"].items():
        setattr(base, key, copy.deepcopy(value))
    delattr(base, CONFIG_KEY)
    return base, record["method"], dict(record["params"])
