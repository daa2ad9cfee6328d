"""Planner: attention-level extension methods on RoPE decoders: the remaps (Self-Extend, DCA), temperature
(log-n) scaling, and a remap with log-n (``"self-extend+logn"``).

The rotary modules stay as they are (or as a combined RoPE scaling leaves them); each attention module gets an
:class:`~hf_posenc.attention.extension.ExtensionState` and the model an attention implementation of hf_posenc's:
a remap's backend (``hf_posenc_extension_<backend>``), or for log-n alone the wrapper of the implementation it
had (``hf_posenc_logn_sdpa`` ...). The saved config gets ``rope_type "hf_posenc_extension"`` in
``rope_parameters`` (the rest of it kept), which plain transformers refuses (``KeyError``) rather than loading
the model without the method; DCA alone on Qwen2 also writes vLLM's ``dual_chunk_attention_config``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

from torch import nn

from ..architectures import (
    PLAIN_ATTENTION_ROPE_MODEL_TYPES,
    STATIC_ROPE_TYPES,
    attention_modules,
    rope_modules,
    rotary_dim,
    rotary_modules,
    served_context,
)
from ..attention import REMAP, TEMPERATURE
from ..attention.extension import ExtensionState, positions_over_mask
from ..methods.dca import DCAParams
from ..record import CONFIG_KEY, PatchRecord
from ..registry import Method, params_to_dict, with_context
from .changes import (
    NoCounterpart,
    check_implementation_before_calls,
    masks_in_forward,
    refuse_training_dropout,
)
from .legacy import VLLM_DCA_KEY
from .plan import PatchInfo, Plan, Planner
from .rope_types import EXTENSION_ROPE_TYPE

logger = logging.getLogger("hf_posenc")

SERVED_ROLES = ("remap", "temperature")
VLLM_DCA_MODEL_TYPES = ("qwen2",)


def _check_model(model: nn.Module, remaps: bool) -> None:
    """The families whose attention these methods are shown on, with plain causal attention; a remap also needs
    frequencies that do not change with the length (cached keys are re-rotated with the current ones)."""
    config = model.config
    if config.model_type not in PLAIN_ATTENTION_ROPE_MODEL_TYPES:
        raise ValueError(
            "The remaps (Self-Extend, DCA, STRING, ReRoPE) and log-n change attention in "
            f"{', '.join(PLAIN_ATTENTION_ROPE_MODEL_TYPES)} models; {type(model).__name__} (model_type "
            f"{config.model_type!r}) is not one of them: its attention may add terms or not go through transformers' "
            "attention interface."
        )
    window, layer_types = getattr(config, "sliding_window", None), getattr(config, "layer_types", None)
    if layer_types is not None:  # Qwen2/Qwen3 window the layers it names, whatever use_sliding_window says
        sliding = "sliding_attention" in layer_types
    else:  # Mistral: every layer, when set
        sliding = window is not None and getattr(config, "use_sliding_window", True)
    if sliding:
        raise ValueError(
            f"This {config.model_type} model uses sliding-window attention (sliding_window={window}); Self-Extend, "
            "DCA and log-n support full causal attention only."
        )
    if remaps:
        types = {config.rope_parameters.get("rope_type")} | {module.rope_type for _, module in rotary_modules(model)}
        if not types <= STATIC_ROPE_TYPES:
            raise ValueError(
                f"The remaps re-rotate cached keys with the model's frequencies, so they need frequencies "
                f"that do not change with the length; this model's rope_type is {sorted(types)}. Combine them with "
                "a static scaling (pi, ntk, yarn, llama3) or none."
            )


def _implementation(model: nn.Module, remap: Any) -> str:
    """The attention implementation the patch selects: the remap's backend (``auto``: flex on CUDA, sdpa
    elsewhere), or log-n's wrapper of the model's own."""
    if remap is not None:
        backend = remap.backend
        if backend == "auto":
            backend = "flex" if next(model.parameters()).is_cuda else "sdpa"
        return REMAP.implementation(backend)
    current = model.config._attn_implementation
    if current not in TEMPERATURE:
        raise ValueError(
            f"log-n scaling wraps the model's attention implementation, and {current!r} is not one it wraps; use "
            f"one of {', '.join(TEMPERATURE.names)} (model.set_attn_implementation(...)) first."
        )
    return TEMPERATURE.implementation(current)


def _vllm_dca_key(config: Any, method: Method, remap: Any) -> dict[str, Any]:
    """vLLM's own spelling of DCA (:data:`~hf_posenc.patching.legacy.VLLM_DCA_KEY`) where it says the patch, so a
    pushed config runs there as is: DCA alone on unscaled Qwen2 RoPE.

    vLLM (the V0 engine of 0.8-0.10, ``dual_chunk_flash_attn.py``; later releases take the key but have no backend
    for it) builds DCA from the key whenever a config has it, before it reads ``rope_parameters``, with the plain
    ``rope_theta``: a combination (``"dca+logn"``, or ``"yarn+dca"``, whose parts are merged in
    :mod:`~hf_posenc.patching.dispatch`) does not write it. Nor does it carry ``original_max_position_embeddings``:
    given that, vLLM multiplies the keys by ``max(1, 0.1 ln(n / L) + 1)`` for an input of ``n`` tokens
    (Qwen2.5-1M's temperature), which the paper's DCA does not have.
    """
    if (
        method.name != "dca"
        or config.model_type not in VLLM_DCA_MODEL_TYPES
        or config.rope_parameters.get("rope_type", "default") != "default"
    ):
        return {}
    return {VLLM_DCA_KEY: {"chunk_size": remap.chunk_size, "local_size": remap.local_size}}


def _with_shipped_sizes(params: Any, shipped: Any) -> Any:
    """DCA's ``params`` (alone or in a combination, built) with the sizes not given taken from the config's
    ``dual_chunk_attention_config`` where it ships them (Qwen2.5-1M), rather than from ``L``."""
    if not isinstance(shipped, dict):
        return params
    dca = next(part for part in getattr(params, "part_params", (params,)) if isinstance(part, DCAParams))
    taken = {key: shipped[key] for key in dca.defaulted if key in shipped}
    return dataclasses.replace(params, **taken) if taken else params


def plan_extension(model: nn.Module, method: Method, params: Any) -> Plan:
    """Validate a remap, log-n, or both (``params``: their parameters, built) on ``model`` and plan them, without
    changing the model."""
    parts = method.components
    remap_method = method.part("remap")
    _check_model(model, remap_method is not None)
    config = model.config
    if remap_method is not None and remap_method.name == "dca":
        params = _with_shipped_sizes(params, getattr(config, VLLM_DCA_KEY, None))
    resolved = with_context(params, served_context(config, params.original_max_position_embeddings))
    by_role = dict(zip((part.role for part in parts), getattr(resolved, "part_params", (resolved,)), strict=True))
    remap, temperature = by_role.get("remap"), by_role.get("temperature")
    if remap is not None:
        refuse_training_dropout(model, "The remaps' attention")
    implementation = _implementation(model, remap)
    rotary = rope_modules(model, scaled_ok=True)[0]

    updates: dict[str, Any] = {
        "rope_parameters": {**config.rope_parameters, "rope_type": EXTENSION_ROPE_TYPE},
    }
    if getattr(remap, "max_position_embeddings", None) is not None:
        updates["max_position_embeddings"] = remap.max_position_embeddings
    updates.update(_vllm_dca_key(config, method, remap))
    base = {key: getattr(config, key, None) for key in updates}
    updates = {**updates, CONFIG_KEY: PatchRecord(method.name, params_to_dict(resolved), False, base).to_dict()}

    chosen = params_to_dict(resolved)
    if remap is not None:
        chosen["backend"] = REMAP.backend_of(implementation)
    info = PatchInfo(method.name, chosen, native=False, rope_type=EXTENSION_ROPE_TYPE)
    state = ExtensionState(remap, temperature, rotary, rotary_dim(config))
    table = REMAP if remap is not None else TEMPERATURE
    install, check = functools.partial(_install, state), check_implementation_before_calls(tuple(table.implementations))
    changes = [(module, change) for module in attention_modules(model) for change in (install, check)]
    changes.insert(0, (model.base_model, _positions_over_mask))
    if remap is not None:
        changes.insert(0, (model, masks_in_forward))
    return Plan(info, updates, changes, _backend_now, attention=implementation)


def _install(state: ExtensionState, module: nn.Module) -> None:
    module.hf_posenc_extension = state


def _positions_over_mask(module: nn.Module) -> None:
    module.register_forward_pre_hook(positions_over_mask, with_kwargs=True)


def extension_loading(params: dict[str, Any], kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Loading a saved model patched with these methods: an ``attn_implementation`` asked for picks a remap's
    backend (``"hf_posenc_extension_flex"``, or ``"eager"`` / ``"sdpa"`` / ``"flex_attention"`` for the backend of
    that kind), and the base model's implementation (what ``unpatch`` gives back): eager for the eager backend, SDPA
    otherwise. For log-n alone it is the implementation wrapped (``"hf_posenc_logn_sdpa"`` or ``"sdpa"``: SDPA).
    A name with no counterpart (``"flash_attention_2"`` for a remap, another method's) is a ``ValueError``."""
    asked = kwargs.get("attn_implementation")
    if asked is None:
        return params, kwargs
    table = TEMPERATURE if "backend" not in params else REMAP  # log-n alone: the base runs what it wraps
    backend = table.for_loading(asked)
    if backend is None:
        raise NoCounterpart(asked, table.standard_names, table.implementations)
    if table is TEMPERATURE:
        return params, {**kwargs, "attn_implementation": backend.base}
    return {**params, "backend": backend.name}, {**kwargs, "attn_implementation": backend.base}


def _backend_now(model: nn.Module, info: PatchInfo) -> PatchInfo:
    """What ``get_patch`` reports: a remap's backend running now."""
    backend = REMAP.backend_of(model.config._attn_implementation)
    if backend is None or "backend" not in info.params:
        return info
    return dataclasses.replace(info, params={**info.params, "backend": backend})


def serves_extension(method: Method) -> bool:
    """Remaps, temperatures, and combinations of nothing else."""
    return all(part.role in SERVED_ROLES for part in method.components)


PLANNER = Planner(
    positions=frozenset({"rope"}), serves=serves_extension, plan=plan_extension, loading=extension_loading
)
