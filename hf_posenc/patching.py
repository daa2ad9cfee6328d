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
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from .alibi_patch import plan_alibi_learned, plan_alibi_rope
from .architectures import positions_of, unsupported
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
class _Record:
    info: PatchInfo
    config_before: dict[str, Any]
    modules_before: list[tuple[nn.Module, dict[str, Any]]] = field(default_factory=list)


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


def _follow_moves(before: dict[str, Any], current: dict[str, Any], parameters: bool) -> dict[str, Any]:
    """Saved tensors moved to the device and dtype their current counterparts have (``model.to`` since)."""
    moved = {}
    for name, tensor in before.items():
        now = current.get(name)
        if tensor is None or now is None or (tensor.device, tensor.dtype) == (now.device, now.dtype):
            moved[name] = tensor
        elif parameters:
            moved[name] = nn.Parameter(tensor.to(device=now.device, dtype=now.dtype), tensor.requires_grad)
        else:
            moved[name] = tensor.to(device=now.device, dtype=now.dtype)
    return moved


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
            if all(module is not saved for saved, _ in record.modules_before):
                record.modules_before.append((module, _snapshot(module)))
            change(module)
    except BaseException:
        _restore(model, record)
        raise
    _RECORDS[model] = record


def _restore(model: nn.Module, record: _Record) -> None:
    config = model.config
    for key, value in record.config_before.items():
        if value is _MISSING:
            config.__dict__.pop(key, None)
        else:
            setattr(config, key, copy.deepcopy(value))
    for module, before in record.modules_before:
        buffers = _follow_moves(before["_buffers"], module._buffers, parameters=False)
        parameters = _follow_moves(before["_parameters"], module._parameters, parameters=True)
        module.__dict__.clear()
        module.__dict__.update(before)
        module.__dict__["_buffers"], module.__dict__["_parameters"] = buffers, parameters


def patch(model: nn.Module, method: str, **params: Any) -> nn.Module:
    """Change how ``model`` encodes position, in place.

    Args:
        model (`torch.nn.Module`): a loaded transformers causal LM: a RoPE decoder (Llama, Mistral, Qwen2/3,
            or any decoder whose RoPE comes from a rotary-embedding module), or GPT-2 (learned positions:
            ``alibi`` and ``pi``).
        method (`str`): one of :func:`hf_posenc.available_methods` (or an alias such as ``"linear"``).
        **params: the method's parameters, e.g. ``factor=4``. ``original_max_position_embeddings``
            defaults to the config's ``max_position_embeddings`` (logged for RoPE models).

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
    """The method applied to ``model`` and its fully resolved parameters, or None."""
    record = _RECORDS.get(model)
    return None if record is None else record.info


@contextlib.contextmanager
def patched(model: nn.Module, method: str, **params: Any) -> Iterator[nn.Module]:
    """``with hf_posenc.patched(model, "yarn", factor=4): ...`` — unpatched on exit, even on error."""
    patch(model, method, **params)
    try:
        yield model
    finally:
        unpatch(model)
