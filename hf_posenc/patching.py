"""The only module that applies changes to a model: plan a patch, apply it, record it, restore it.

A planner per (kind of position encoding, method) validates and computes a :class:`~hf_posenc.plan.Plan`
without touching the model: RoPE scaling (:mod:`hf_posenc.rope_patch`), ALiBi on RoPE or learned
positions (:mod:`hf_posenc.alibi_patch`), Position Interpolation of a learned table
(:mod:`hf_posenc.learned_patch`). Applying it records every config attribute it sets and the state of
every module it changes, per model instance; ``unpatch`` puts back exactly that. Classes and
transformers modules are never touched, so two models in one process do not affect each other.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from .alibi_patch import plan_alibi_learned, plan_alibi_rope
from .architectures import positions_of, unsupported
from .attention import BACKEND_OF
from .config import CONFIG_KEY
from .learned_patch import plan_learned_pi
from .plan import PatchInfo, Plan
from .registry import Method, get_method
from .rope_patch import plan_rope_scaling

__all__ = ["PatchInfo", "get_patch", "patch", "patched", "unpatch"]

logger = logging.getLogger("hf_posenc")

_MISSING = object()

Planner = Callable[[nn.Module, Method, dict[str, Any]], Plan]
# (position kind, method) -> planner; (kind, None): every method with frequencies (the RoPE scaling ones).
PLANNERS: dict[tuple[str, str | None], Planner] = {
    ("rope", None): plan_rope_scaling,
    ("rope", "alibi"): plan_alibi_rope,
    ("learned", "alibi"): plan_alibi_learned,
    ("learned", "pi"): plan_learned_pi,
}


def _planner(model: nn.Module, method: Method) -> Planner:
    positions = positions_of(model)
    planner = PLANNERS.get((positions.kind, method.name))
    if planner is None and method.frequencies is not None:
        planner = PLANNERS.get((positions.kind, None))
    if planner is None or positions.kind not in method.applies_to:
        raise unsupported(model, method, positions)
    return planner


@dataclass
class _ModuleRecord:
    """A changed module: its attributes before the patch, the layout of the tensors and the hook ids the
    patch left on it (so that ``unpatch`` follows a later ``model.to`` and keeps hooks added since)."""

    module: nn.Module
    before: dict[str, Any]
    installed: dict[str, tuple[torch.device, torch.dtype]] = field(default_factory=dict)
    hooks: dict[str, set[int]] = field(default_factory=dict)


@dataclass
class _Record:
    info: PatchInfo
    config_before: dict[str, Any]
    modules: list[_ModuleRecord] = field(default_factory=list)


_RECORDS: weakref.WeakKeyDictionary[nn.Module, _Record] = weakref.WeakKeyDictionary()


def _plan(model: nn.Module, method_name: str, params: dict[str, Any]) -> Plan:
    """Validate everything and compute the patch without changing the model."""
    if model in _RECORDS:
        raise RuntimeError(
            f"This model is already patched with {_RECORDS[model].info.method!r}; call hf_posenc.unpatch(model) first."
        )
    record = getattr(model.config, CONFIG_KEY, None)
    if record and not record.get("baked"):
        raise RuntimeError(
            "This model's config already carries an hf_posenc patch but was not loaded through hf_posenc; "
            "load it with hf_posenc.from_pretrained(...) to get a model that can be unpatched."
        )
    method = get_method(method_name)
    return _planner(model, method)(model, method, dict(params))


def _snapshot(module: nn.Module) -> dict[str, Any]:
    """The instance's attributes; its dicts and sets (buffers, parameters, hooks) copied one level."""
    return {
        key: copy.copy(value) if isinstance(value, (dict, set)) else value for key, value in module.__dict__.items()
    }


def _hook_dicts(module: nn.Module) -> dict[str, dict]:
    """The module's hook registries (``_forward_pre_hooks`` ...): hook id -> hook."""
    return {key: value for key, value in module.__dict__.items() if "hooks" in key and isinstance(value, dict)}


def _tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor for name, tensor in {**module._buffers, **module._parameters}.items() if tensor is not None}


def _finish(entry: _ModuleRecord) -> None:
    """Note what the patch left on the module: tensor layouts and new hook ids."""
    entry.installed = {name: (tensor.device, tensor.dtype) for name, tensor in _tensors(entry.module).items()}
    entry.hooks = {key: set(hooks) - set(entry.before.get(key, ())) for key, hooks in _hook_dicts(entry.module).items()}


def _follow_moves(
    entry: _ModuleRecord, current: dict[str, torch.Tensor], name: str, tensor: torch.Tensor | None
) -> torch.Tensor | None:
    """A saved tensor moved to the device / cast to the dtype its ``current`` counterpart took since the
    patch (``model.to`` between patch and unpatch); as it was where nothing moved."""
    now, installed = current.get(name), entry.installed.get(name)
    if tensor is None or now is None or installed is None:
        return tensor
    device = now.device if now.device != installed[0] else tensor.device
    dtype = now.dtype if now.dtype != installed[1] else tensor.dtype
    if (device, dtype) == (tensor.device, tensor.dtype):
        return tensor
    moved = tensor.to(device=device, dtype=dtype)
    return nn.Parameter(moved, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else moved


def _apply(model: nn.Module, plan: Plan) -> None:
    config = model.config
    record = _Record(
        info=plan.info,
        config_before={
            key: copy.deepcopy(config.__dict__[key]) if key in config.__dict__ else _MISSING for key in plan.updates
        },
    )
    try:
        for key, value in plan.updates.items():
            setattr(config, key, copy.deepcopy(value))
        for module, change in plan.changes:
            if all(module is not entry.module for entry in record.modules):
                record.modules.append(_ModuleRecord(module, _snapshot(module)))
            change(module)
    except BaseException:
        _restore(model, record)
        raise
    for entry in record.modules:
        _finish(entry)
    _RECORDS[model] = record


def _restore(model: nn.Module, record: _Record) -> None:
    config = model.config
    for key, value in record.config_before.items():
        if value is _MISSING:
            config.__dict__.pop(key, None)
        else:
            setattr(config, key, copy.deepcopy(value))
    for entry in record.modules:
        module, before, current = entry.module, entry.before, _tensors(entry.module)
        restored = {
            key: {name: _follow_moves(entry, current, name, tensor) for name, tensor in before[key].items()}
            for key in ("_buffers", "_parameters")
        }
        for key, hooks in _hook_dicts(module).items():  # hooks added since the patch stay
            restored[key] = type(hooks)((i, hook) for i, hook in hooks.items() if i not in entry.hooks.get(key, ()))
        module.__dict__.clear()
        module.__dict__.update(before)
        module.__dict__.update(restored)


def patch(model: nn.Module, method: str, **params: Any) -> nn.Module:
    """Change how ``model`` encodes position, in place.

    Args:
        model (`torch.nn.Module`): a loaded transformers causal LM: a RoPE decoder (Llama, Mistral, Qwen2/3,
            or any decoder whose RoPE comes from a rotary-embedding module), or GPT-2 (learned positions:
            ``alibi`` and ``pi``).
        method (`str`): one of :func:`hf_posenc.available_methods` (or an alias such as ``"linear"``).
        **params: the method's parameters, e.g. ``factor=4``. RoPE methods' ``original_max_position_embeddings``
            defaults to the one the config records, else to its ``max_position_embeddings`` (logged).

    Returns:
        The same ``model``, patched; ``model.config`` now describes the method.

    Raises:
        ValueError / TypeError: unknown method or parameter, bad value, unsupported architecture.
        RuntimeError: the model is already patched.
        On any error the model is left exactly as it was.
    """
    plan = _plan(model, method, params)
    _apply(model, plan)
    logger.info("hf_posenc: patched %s with %s %s", type(model).__name__, plan.info.method, plan.info.params)
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Undo :func:`patch`: config, buffers, parameters, attributes and forward exactly as before. Returns ``model``."""
    record = _RECORDS.get(model)
    if record is None:
        raise RuntimeError("This model is not patched by hf_posenc; there is nothing to unpatch.")
    _restore(model, record)
    del _RECORDS[model]
    return model


def get_patch(model: nn.Module) -> PatchInfo | None:
    """The method applied to ``model`` and its fully resolved parameters, or None. For ALiBi the backend
    is the one running now (``set_attn_implementation`` may have switched it)."""
    record = _RECORDS.get(model)
    if record is None:
        return None
    backend = BACKEND_OF.get(model.config._attn_implementation)  # ALiBi: switched since the patch?
    if "backend" in record.info.params and backend is not None:
        return replace(record.info, params={**record.info.params, "backend": backend})
    return record.info


@contextlib.contextmanager
def patched(model: nn.Module, method: str, **params: Any) -> Iterator[nn.Module]:
    """``with hf_posenc.patched(model, "yarn", factor=4): ...`` — unpatched on exit, even on error."""
    patch(model, method, **params)
    try:
        yield model
    finally:
        unpatch(model)
