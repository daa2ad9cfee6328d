"""Planner: attention biases in place of the model's positions. ALiBi (Press et al. 2022) and the T5 relative
bias (Raffel et al. 2020) on RoPE decoders and on GPT-2.

The model's own positions contribute nothing (:func:`~hf_posenc.patching.changes.positions_removed`: the
identity rotation, or GPT-2's ``wpe`` giving zeros); the attention implementation becomes one of hf_posenc's
backends of the method, registered with transformers' attention and mask interfaces, so transformers' own
dispatch adds the bias. ALiBi gives each attention module its heads' slopes; the T5 bias registers one trainable
``nn.Embedding(num_buckets, num_heads)`` on the decoder (``position_bias``: saved with the model), which every
attention module reads.

The saved config cannot load silently without hf_posenc (the marker of ``positions_removed``); when
:func:`hf_posenc.from_pretrained` loads it, ``attn_implementation`` picks the method's backend
(:func:`bias_loading`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..architectures import attention_modules
from ..attention import ALIBI, T5, BackendTable, cudnn
from ..attention.functions import fused_problem
from ..methods.alibi import alibi_slopes, are_paper_slopes
from ..methods.t5_bias import t5_bias_init
from ..registry import Method, params_to_dict
from .changes import (
    NoCounterpart,
    check_implementation_before_calls,
    masks_in_forward,
    positions_removed,
    refuse_training_dropout,
    replacement_updates,
    trains_with_dropout,
)
from .plan import ModuleChange, PatchInfo, Plan, Planner
from .wrappers import accelerate_hooks

logger = logging.getLogger("hf_posenc")

T5_TABLE = "position_bias"  # the T5 bias table's name on the decoder (state dict: model.position_bias.weight)


@dataclass(frozen=True)
class BiasMethod:
    """How one bias method is planned.

    Attributes:
        table (`BackendTable`): its backends (:mod:`hf_posenc.attention.backends`).
        resolve (`Callable`): ``resolve(model, method, requested) -> resolved params`` (backend chosen, defaults
            filled in); validates against the model.
        install (`Callable`): ``install(model, resolved, attention modules) -> [(module, change)]``: what each
            attention module (and the decoder) gets.
    """

    table: BackendTable
    resolve: Callable[[nn.Module, Method, Any], Any]
    install: Callable[[nn.Module, Any, list[nn.Module]], list[tuple[nn.Module, ModuleChange]]]


# ALiBi --------------------------------------------------------------------------------------------------------


def _resolve_alibi(model: nn.Module, method: Method, requested: Any) -> Any:
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
    """The ALiBi backend a patch uses: the requested one; for ``"auto"``, cudnn where it can serve the model on
    this GPU, else flex on CUDA and sdpa elsewhere, and sdpa for a model in training mode with attention dropout
    (neither cudnn nor flex has any). ``"cudnn"`` that cannot serve it is an error."""
    if requested not in ("auto", "cudnn"):
        return requested
    if requested == "auto" and trains_with_dropout(model):
        return "sdpa"
    problem = _fused_problem(model, slopes)
    if requested == "cudnn" and problem is not None:
        raise ValueError(
            f"The ALiBi cudnn backend cannot be used: {problem}. Use backend 'flex' or 'auto' (backend='auto' in "
            "patch, alibi:backend=auto in a method spec)."
        )
    if problem is None:
        return "cudnn"
    if next(model.parameters()).is_cuda:
        level = logging.INFO if not cudnn.installed() else logging.WARNING
        logger.log(level, "ALiBi backend 'auto' uses flex: the cudnn backend cannot be used, as %s.", problem)
        return "flex"
    return "sdpa"


def _install_alibi(model: nn.Module, resolved: Any, modules: list[nn.Module]) -> list[tuple[nn.Module, ModuleChange]]:
    return [(module, functools.partial(_alibi_slopes, resolved.slopes)) for module in modules]


def _alibi_slopes(slopes: tuple[float, ...], module: nn.Module) -> None:
    module.alibi_slopes = torch.tensor(slopes, dtype=torch.float32)
    module.alibi_paper_slopes = are_paper_slopes(slopes)  # what cuDNN's fused kernel computes


# T5 bias ------------------------------------------------------------------------------------------------------


def _resolve_t5(model: nn.Module, method: Method, requested: Any) -> Any:
    """``"auto"``: flex on CUDA (memory linear in the length) unless the model trains with attention dropout (GPT-2's
    ``attn_pdrop``: flex has none), sdpa elsewhere."""
    if requested.backend != "auto":
        return requested
    backend = "flex" if next(model.parameters()).is_cuda and not trains_with_dropout(model) else "sdpa"
    return dataclasses.replace(requested, backend=backend)


def _install_t5(model: nn.Module, resolved: Any, modules: list[nn.Module]) -> list[tuple[nn.Module, ModuleChange]]:
    """One table for all layers (T5 shares it), registered on the decoder, in the model's dtype and device."""
    if hasattr(model.base_model, T5_TABLE):
        raise ValueError(
            f"hf_posenc registers the T5 bias table as {T5_TABLE!r} on {type(model.base_model).__name__}, which "
            "already has an attribute of that name."
        )
    init = t5_bias_init(
        model.config.num_attention_heads,
        num_buckets=resolved.num_buckets,
        max_distance=resolved.max_distance,
        init=resolved.init,
    )
    dtype = next(model.parameters()).dtype
    # (num_buckets, H), given its weight: no random initialisation, which would draw from torch's global generator
    table = nn.Embedding(*init.shape, _weight=init.to(device=_table_device(model), dtype=dtype))
    bucketing = (resolved.num_buckets, resolved.max_distance)
    share = functools.partial(_share_table, table, bucketing)
    return [(model.base_model, functools.partial(_register_table, table))] + [(module, share) for module in modules]


def _table_device(model: nn.Module) -> torch.device:
    """Where the table is made: the device of the model's first parameter; for a model accelerate offloads (its
    parameters on the meta device, their values in its hooks) the device those hooks compute on. A model built on
    the meta device, which holds no values anywhere (a config-only push), keeps its table there."""
    first = next(model.parameters()).device
    if first.type != "meta":
        return first
    for module in model.modules():
        for hook in accelerate_hooks(module):
            device = getattr(hook, "execution_device", None)
            if device is not None:
                return torch.device(device)
    return first


def _register_table(table: nn.Embedding, decoder: nn.Module) -> None:
    decoder.add_module(T5_TABLE, table)


def _share_table(table: nn.Embedding, bucketing: tuple[int, int], module: nn.Module) -> None:
    """The table as a plain attribute (``__dict__``, not a submodule): registered once, on the decoder."""
    module.__dict__["t5_position_bias"] = table
    module.t5_bucketing = bucketing


BIAS_METHODS = {
    "alibi": BiasMethod(ALIBI, _resolve_alibi, _install_alibi),
    "t5-bias": BiasMethod(T5, _resolve_t5, _install_t5),
}


def plan_bias(model: nn.Module, method: Method, requested: Any) -> Plan:
    """ALiBi or the T5 bias (``requested``: its parameters, built) on whichever positions ``model`` has (RoPE or a
    learned table)."""
    bias = BIAS_METHODS[method.name]
    config_changes, removal, rope_type = positions_removed(model, method)
    resolved = bias.resolve(model, method, requested)
    if resolved.backend in ("flex", "cudnn"):
        refuse_training_dropout(model, f"The {method.name} {resolved.backend} backend", "sdpa")
    # The config records the backend asked for ("auto" by default), not the one chosen here: a model saved from a
    # GPU (with the cudnn extra) must load on a machine without either.
    info, updates = replacement_updates(
        model,
        method,
        params_to_dict(resolved),
        config_changes,
        rope_type,
        recorded={"backend": requested.backend},
    )
    modules = attention_modules(model)
    check = check_implementation_before_calls(tuple(bias.table.implementations))
    changes = [*removal, (model, masks_in_forward), *bias.install(model, resolved, modules)]
    changes += [(module, check) for module in modules]
    report = functools.partial(_backend_now, method.name)  # a name: pickles
    return Plan(info, updates, changes, report, attention=bias.table.implementation(resolved.backend))


def _backend_now(name: str, model: nn.Module, info: PatchInfo) -> PatchInfo:
    """What ``get_patch`` reports: the backend running now (``set_attn_implementation`` may have switched to another
    since the patch)."""
    bias = BIAS_METHODS[name]
    backend = bias.table.backend_of(model.config._attn_implementation)
    return info if backend is None else dataclasses.replace(info, params={**info.params, "backend": backend})


def loading_backend(bias: BiasMethod, attn_implementation: str) -> tuple[str, str]:
    """``(backend, base model's implementation)`` for ``attn_implementation`` asked for when loading a saved model
    patched with a bias method: a standard name (``"sdpa"``) selects the backend replacing it, one of the method's
    names (``"hf_posenc_alibi_flex"``) that backend; the base model (what ``unpatch`` gives back) gets eager for
    eager, SDPA otherwise."""
    backend = bias.table.for_loading(attn_implementation)
    if backend is None:
        raise NoCounterpart(attn_implementation, bias.table.standard_names, bias.table.implementations)
    return backend.name, backend.base


def bias_loading(
    bias: BiasMethod, params: dict[str, Any], kwargs: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Loading a saved model patched with a bias method: an ``attn_implementation`` asked for picks the backend
    (and the base model's implementation) instead of the recorded backend."""
    if kwargs.get("attn_implementation") is None:
        return params, kwargs
    backend, base_implementation = loading_backend(bias, kwargs["attn_implementation"])
    return {**params, "backend": backend}, {**kwargs, "attn_implementation": base_implementation}


def _planner(name: str) -> Planner:
    return Planner(
        positions=frozenset({"rope", "learned"}),
        serves=lambda method: method.name == name,
        plan=plan_bias,
        loading=functools.partial(bias_loading, BIAS_METHODS[name]),
    )


ALIBI_PLANNER = _planner("alibi")
T5_PLANNER = _planner("t5-bias")
