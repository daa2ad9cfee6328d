"""Planner: attention-level methods. ALiBi (Press et al. 2022) on RoPE decoders and on GPT-2.

RoPE becomes the identity rotation (``inv_freq = 0``: ``cos = 1``, ``sin = 0`` exactly) and GPT-2's
``wpe`` contributes zeros; the attention implementation becomes one of hf_posenc's ALiBi backends,
registered with transformers' attention and mask interfaces, so transformers' own dispatch adds the bias.
Each attention module gets its heads' slopes as an instance attribute.

The saved config cannot load silently without hf_posenc: RoPE models get ``rope_type
"hf_posenc_alibi"`` (plain transformers: ``KeyError``), GPT-2 gets ``activation_function
"hf_posenc_alibi"`` (plain transformers: ``KeyError`` from its activation table). ``config.hf_posenc``
keeps the base values, which :func:`hf_posenc.from_pretrained` puts back before patching again; when it
loads, ``attn_implementation`` picks the ALiBi backend (:func:`alibi_loading`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

import torch
from torch import nn

from ..architectures import (
    PLAIN_ATTENTION_ROPE_MODEL_TYPES,
    attention_modules,
    position_table,
    positions_of,
    rope_modules,
)
from ..attention import BACKEND_OF, IMPLEMENTATIONS, cudnn
from ..attention.functions import fused_problem
from ..methods.alibi import alibi_slopes, are_paper_slopes
from ..record import CONFIG_KEY, PatchRecord
from ..registry import Method, params_to_dict
from .changes import ATTENTION, masks_in_forward
from .plan import ModuleChange, PatchInfo, Plan, Planner
from .rope_types import ALIBI_ROPE_TYPE, OWN_ROPE_TYPE

logger = logging.getLogger("hf_posenc")

ALIBI_GPT2_ACTIVATION = "hf_posenc_alibi"


# Standard implementations -> the ALiBi backend that replaces each, and back: the base model is built with
# eager or SDPA (GPT-2 has no flex_attention), so a model unpatched after loading gets those.
_STANDARD = {"eager": "eager", "sdpa": "sdpa", "flex_attention": "flex"}
_BASE_OF = {"eager": "eager", "sdpa": "sdpa", "flex": "sdpa", "cudnn": "sdpa"}


def loading_backend(attn_implementation: str) -> tuple[str, str]:
    """``(ALiBi backend, base model's implementation)`` for ``attn_implementation`` asked for when loading
    a saved ALiBi model: a standard name (``"sdpa"``) selects the ALiBi backend replacing it, an ALiBi name
    (``"hf_posenc_alibi_flex"``) that backend; the base model (what ``unpatch`` gives back) gets eager for
    eager, SDPA otherwise."""
    backend = _STANDARD.get(attn_implementation) or BACKEND_OF.get(attn_implementation)
    if backend is None:
        raise ValueError(
            f"attn_implementation={attn_implementation!r} has no ALiBi counterpart; this model is patched with "
            f"ALiBi, so use one of {', '.join(_STANDARD)}, {', '.join(IMPLEMENTATIONS.values())}."
        )
    return backend, _BASE_OF[backend]


def _resolve(model: nn.Module, method: Method, requested: Any) -> Any:
    """The parameters asked for with the backend chosen (:func:`choose_backend`) and the slopes filled in."""
    heads = model.config.num_attention_heads
    if requested.slopes is not None and len(requested.slopes) != heads:
        raise ValueError(f"{len(requested.slopes)} ALiBi slopes given; this model has {heads} query heads.")
    slopes = requested.slopes or tuple(alibi_slopes(heads).tolist())
    return method.make_params(backend=choose_backend(model, requested.backend, slopes), slopes=slopes)


def _fused_problem(model: nn.Module, slopes: tuple[float, ...]) -> str | None:
    """Why cuDNN's fused ALiBi cannot serve this model, or None."""
    config, heads = model.config, model.config.num_attention_heads
    device = next(model.parameters()).device
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return fused_problem(are_paper_slopes(slopes), device, heads, kv_heads, attention_modules(model)[0].head_dim)


def choose_backend(model: nn.Module, requested: str, slopes: tuple[float, ...]) -> str:
    """The backend a patch uses: the requested one; for ``"auto"``, cudnn where it can serve the model on
    this GPU, else flex on CUDA and sdpa elsewhere. ``"cudnn"`` that cannot serve it is an error."""
    if requested not in ("auto", "cudnn"):
        return requested
    problem = _fused_problem(model, slopes)
    if requested == "cudnn" and problem is not None:
        raise ValueError(f"The ALiBi cudnn backend cannot be used: {problem}. Use backend='flex' or 'auto'.")
    if problem is None:
        return "cudnn"
    if next(model.parameters()).is_cuda:
        level = logging.INFO if not cudnn.installed() else logging.WARNING
        logger.log(level, "ALiBi backend 'auto' uses flex: the cudnn backend cannot be used, as %s.", problem)
        return "flex"
    return "sdpa"


def _alibi_attention(slopes: tuple[float, ...], module: nn.Module) -> None:
    """The module's slopes, and a check before each call that the ALiBi implementation is still selected:
    ``set_attn_implementation("sdpa")`` would silently drop the bias, leaving no position information."""
    module.alibi_slopes = torch.tensor(slopes, dtype=torch.float32)
    module.alibi_paper_slopes = are_paper_slopes(slopes)  # what cuDNN's fused kernel computes
    module.register_forward_pre_hook(_check_implementation)


def _check_implementation(module: nn.Module, args: tuple) -> None:
    selected = module.config._attn_implementation
    if selected not in IMPLEMENTATIONS.values():
        raise RuntimeError(
            f"This model is patched with ALiBi, but its attention implementation is now {selected!r}, which adds "
            f"no ALiBi bias (set_attn_implementation?): it would run without any position information. Select "
            f"one of {', '.join(IMPLEMENTATIONS.values())}, or call hf_posenc.unpatch(model) first."
        )


def _no_rotation(module: nn.Module) -> None:
    module.inv_freq = torch.zeros_like(module.inv_freq)
    module.original_inv_freq = module.inv_freq.clone()
    module.attention_scaling = 1.0
    module.rope_type = OWN_ROPE_TYPE  # transformers' dynamic update skips it; its weight init gives zeros


def _no_positions(module: nn.Module) -> None:
    """GPT-2's ``wpe`` looks every position up as row 0 (any length runs) and returns zeros. Hooks (module-level
    functions) rather than a new forward, so ``copy.deepcopy(model)`` and pickling keep them bound to the copy."""
    module.register_forward_pre_hook(_row_zero)
    module.register_forward_hook(_zeros)


def _row_zero(module: nn.Module, args: tuple) -> tuple:
    return tuple(torch.zeros_like(arg) if isinstance(arg, torch.Tensor) else arg for arg in args)


def _zeros(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(output)


def _alibi_changes(
    model: nn.Module, method: Method, params: dict[str, Any], config_changes: dict[str, Any], rope_type: str | None
) -> tuple[PatchInfo, dict[str, Any], list[tuple[nn.Module, ModuleChange]]]:
    """What ALiBi changes on any model: the config record, the attention implementation, each attention
    module's slopes; ``config_changes`` are the model's own (what makes its positions contribute nothing)."""
    requested = method.make_params(**params)
    resolved = _resolve(model, method, requested)
    config = model.config
    info = PatchInfo(method.name, params_to_dict(resolved), native=False, rope_type=rope_type)
    base = {key: getattr(config, key) for key in config_changes}
    # The config records the backend asked for ("auto" by default), not the one chosen here: a model saved
    # from a GPU with the cudnn extra must load on a machine without either.
    recorded = {**info.params, "backend": requested.backend}
    updates = {
        **config_changes,
        ATTENTION: IMPLEMENTATIONS[resolved.backend],
        CONFIG_KEY: PatchRecord(method.name, recorded, False, base).to_dict(),
    }
    slopes = [(module, functools.partial(_alibi_attention, resolved.slopes)) for module in attention_modules(model)]
    return info, updates, [(model, masks_in_forward), *slopes]


def _plan_alibi_rope(model: nn.Module, method: Method, params: dict[str, Any]) -> Plan:
    """ALiBi on a RoPE decoder (Llama, Mistral, Qwen2/3): no rotation, the bias in attention."""
    model_type = model.config.model_type
    if model_type not in PLAIN_ATTENTION_ROPE_MODEL_TYPES:
        raise ValueError(
            f"ALiBi replaces RoPE in {', '.join(PLAIN_ATTENTION_ROPE_MODEL_TYPES)} models (and GPT-2's learned "
            f"positions); {type(model).__name__} (model_type {model_type!r}) is not one of them: its attention may "
            "add terms or not go through transformers' attention interface, so the bias could be silently wrong."
        )
    rotary = rope_modules(model, scaled_ok=True)  # no rotation is left: how it was scaled is moot
    rope_parameters = {**model.config.rope_parameters, "rope_type": ALIBI_ROPE_TYPE}
    changes = {"rope_parameters": rope_parameters}
    info, updates, attention = _alibi_changes(model, method, params, changes, ALIBI_ROPE_TYPE)
    return Plan(info, updates, [(module, _no_rotation) for module in rotary] + attention, _backend_now)


def _plan_alibi_learned(model: nn.Module, method: Method, params: dict[str, Any]) -> Plan:
    """ALiBi on GPT-2: ``wpe`` returns zeros (any length runs), the bias in attention."""
    table = position_table(model)
    changes = {"activation_function": ALIBI_GPT2_ACTIVATION}
    info, updates, attention = _alibi_changes(model, method, params, changes, None)
    return Plan(info, updates, [(table, _no_positions), *attention], _backend_now)


def _backend_now(model: nn.Module, info: PatchInfo) -> PatchInfo:
    """What ``get_patch`` reports: the ALiBi backend running now (``set_attn_implementation`` may have switched
    to another since the patch)."""
    backend = BACKEND_OF.get(model.config._attn_implementation)
    return info if backend is None else dataclasses.replace(info, params={**info.params, "backend": backend})


def plan_alibi(model: nn.Module, method: Method, params: dict[str, Any]) -> Plan:
    """ALiBi on whichever positions ``model`` has: RoPE or a learned table."""
    if positions_of(model).kind == "rope":
        return _plan_alibi_rope(model, method, params)
    return _plan_alibi_learned(model, method, params)


def alibi_loading(params: dict[str, Any], kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Loading a saved ALiBi model: an ``attn_implementation`` asked for picks the ALiBi backend (and the base
    model's implementation) instead of the recorded backend."""
    if kwargs.get("attn_implementation") is None:
        return params, kwargs
    backend, base_implementation = loading_backend(kwargs["attn_implementation"])
    return {**params, "backend": backend}, {**kwargs, "attn_implementation": base_implementation}


def is_alibi(method: Method) -> bool:
    return method.name == "alibi"


PLANNER = Planner(positions=frozenset({"rope", "learned"}), serves=is_alibi, plan=plan_alibi, loading=alibi_loading)
