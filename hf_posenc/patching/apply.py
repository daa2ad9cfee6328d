"""The only module that applies changes to a model: plan a patch, apply it, record it, restore it.

The planner that serves the method on the model (:mod:`hf_posenc.patching.dispatch`) validates and
computes a :class:`~hf_posenc.patching.plan.Plan` without touching the model. Applying it records every
config attribute it sets and the state of every module it changes on the model instance (an attribute, so that
``copy.deepcopy`` and ``torch.save`` of a patched model carry it into the copy); ``unpatch`` puts back exactly
that. Classes and transformers modules are never touched, so two models in one process do not affect each other.

``patch`` and ``unpatch`` hold a lock of the model instance from the check to the record, so threads patching
one model at once find it patched or unpatched, never half of each; different models do not wait for each other.
"""

from __future__ import annotations

import contextlib
import copy
import enum
import logging
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig

from ..architectures import positions_of
from ..record import PatchRecord, set_config_attribute
from ..registry import Method, get_method
from ..spec import MethodSpec
from .changes import set_updates, updated_config
from .dispatch import plan_method
from .module_ref import ModuleRef
from .plan import UNPATCHED_PREFIX, PatchInfo, Plan
from .wrappers import unwrapped

logger = logging.getLogger("hf_posenc")


class _Absent(enum.Enum):
    """What a config key or attribute held before the patch where it held nothing (an enum member is itself in a
    deepcopy or a pickle of a patched model, which carry its record)."""

    ABSENT = "absent"


_MISSING = _Absent.ABSENT


@dataclass
class _ModuleState:
    """A changed module: its attributes before the patch and which of them the patch changed (so that ``unpatch``
    puts back only those, and keeps what was changed since: the train/eval flag, submodules swapped in, hooks
    added). The tensors it replaced stay on the module (:data:`~hf_posenc.patching.plan.UNPATCHED_PREFIX`), so that
    they follow a later ``model.to``."""

    ref: ModuleRef
    before: dict[str, Any]
    # attribute -> None (replaced, added or removed) or, for a dict or set (buffers, submodules, hooks), its entries
    changed: dict[str, set[Any] | None] = field(default_factory=dict)

    @property
    def module(self) -> nn.Module | None:
        """The module, or None where nothing holds it any more (swapped out of the model since)."""
        return self.ref()


@dataclass
class _AppliedPatch:
    """A patch applied to one model instance: what ``get_patch`` reports and what ``unpatch`` restores."""

    info: PatchInfo
    owner: ModuleRef = field(repr=False)  # the model patched; in a deepcopy or pickle of it, the copy
    config_before: dict[str, Any] = field(default_factory=dict)
    modules: list[_ModuleState] = field(default_factory=list)
    report: Callable[[nn.Module, PatchInfo], PatchInfo] | None = None
    added: frozenset[str] = frozenset()  # state-dict names the patch added (the T5 bias table)
    initial: dict[str, torch.Tensor] = field(default_factory=dict)  # their values as the patch made them


ATTENTION = "_attn_implementation_internal"  # what set_attn_implementation sets; unpatch puts its value back
_APPLIED = "_hf_posenc_applied"  # the model's attribute holding its _AppliedPatch: a deepcopy or pickle carries it
_LOCKS: weakref.WeakKeyDictionary[nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_LOCKS_LOCK = threading.Lock()  # guards making a model's lock


def _applied(model: nn.Module) -> _AppliedPatch | None:
    """The patch applied to ``model``, or None: to this instance, or to the one it is a deepcopy or pickle of (they
    copy the record with its owner); not to a shallow copy (``copy.copy``, accelerate's regional compilation), which
    shares the original's modules and record, and is not the record's owner."""
    applied = model.__dict__.get(_APPLIED) if isinstance(model, nn.Module) else None
    return applied if applied is not None and applied.owner() is model else None


def _lock_of(model: nn.Module) -> threading.RLock:
    """The lock ``patch`` and ``unpatch`` hold on ``model`` (one per instance, made on first use)."""
    with _LOCKS_LOCK:
        if model not in _LOCKS:
            _LOCKS[model] = threading.RLock()
        return _LOCKS[model]


def plan_patch(model: nn.Module, method: Method, params: Any) -> Plan:
    """Validate everything and compute the patch of ``method`` (``params``: its parameters, built) without changing
    the model."""
    if not isinstance(getattr(model, "config", None), PretrainedConfig):
        raise TypeError(
            f"hf_posenc patches a transformers model (one with a config, as from_pretrained loads it), not a "
            f"{type(model).__name__}."
        )
    if _applied(model) is not None:
        raise RuntimeError(
            f"This model is already patched with {_applied(model).info.method!r}; call hf_posenc.unpatch(model) first."
        )
    record = PatchRecord.from_config(model.config, missing_ok=True)
    if record and not record.baked:
        raise RuntimeError(
            "This model's config already carries an hf_posenc patch but was not loaded through hf_posenc; "
            "load it with hf_posenc.from_pretrained(...) to get a model that can be unpatched. (A model built from "
            "the config object of one patched since shares it: give each model its own copy.deepcopy(config).)"
        )
    return plan_method(model, method, params)


def _snapshot(module: nn.Module) -> dict[str, Any]:
    """The instance's attributes; its dicts and sets (buffers, parameters, hooks) copied one level."""
    return {
        key: copy.copy(value) if isinstance(value, (dict, set)) else value for key, value in module.__dict__.items()
    }


def _tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor for name, tensor in {**module._buffers, **module._parameters}.items() if tensor is not None}


def _finish(entry: _ModuleState) -> None:
    """Keep each tensor the patch replaced or removed on the module as a non-persistent buffer
    (:data:`~hf_posenc.patching.plan.UNPATCHED_PREFIX`), then note what the patch changed on the module (attributes,
    and the entries of its dicts and sets: those buffers among them)."""
    module, before = entry.module, entry.before
    now = _tensors(module)
    for kind in ("_buffers", "_parameters"):
        for name, tensor in before.get(kind, {}).items():
            if tensor is not None and now.get(name) is not tensor:
                module.register_buffer(UNPATCHED_PREFIX + name, tensor.detach(), persistent=False)
    after = module.__dict__
    for key in before.keys() | after.keys():
        old, new = before.get(key, _MISSING), after.get(key, _MISSING)
        if type(old) is type(new) and isinstance(new, (dict, set)):
            entries = _changed_entries(old, new)
            if entries:
                entry.changed[key] = entries
        elif old is not new:
            entry.changed[key] = None
    entry.before = {key: _kept(before[key], entries) for key, entries in entry.changed.items() if key in before}


def _kept(old: Any, entries: set[Any] | None) -> Any:
    """What ``unpatch`` reads of an attribute's value before the patch: all of it where the patch replaced it, a
    dict's changed entries only, a set whole. The rest is not kept, so that a module swapped since (a resized
    ``lm_head``) is not held alive, deep-copied or pickled with the patch."""
    if entries is None or not isinstance(old, dict):
        return old
    return {name: old[name] for name in entries if name in old}


def _changed_entries(old: dict | set, new: dict | set) -> set[Any]:
    """The keys (of a dict) or elements (of a set) added, removed or replaced between ``old`` and ``new``."""
    if isinstance(new, set):
        return old ^ new
    return {key for key in old.keys() | new.keys() if old.get(key, _MISSING) is not new.get(key, _MISSING)}


def _followed(current: dict[str, torch.Tensor], name: str, tensor: torch.Tensor | None) -> torch.Tensor | None:
    """The tensor ``tensor`` the patch replaced, as its copy on the module is now: moved and cast as the unpatched
    model's by the same calls since, a cast there and back (``.to(bfloat16).to(float32)``) rounding it. ``tensor``
    itself where nothing moved."""
    kept = current.get(UNPATCHED_PREFIX + name)
    if tensor is None or kept is None:
        return tensor
    if (kept.data_ptr(), kept.dtype, kept.device) == (tensor.data_ptr(), tensor.dtype, tensor.device):
        return tensor
    return nn.Parameter(kept, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else kept


def _apply(model: nn.Module, plan: Plan) -> None:
    config = model.config
    keys = [*plan.updates, *([ATTENTION] if plan.attention is not None else [])]
    applied = _AppliedPatch(
        info=plan.info,
        owner=ModuleRef(model),
        config_before={key: copy.deepcopy(config.__dict__.get(key, _MISSING)) for key in keys},
        report=plan.report,
    )
    names_before = set(model.state_dict())
    try:
        set_updates(config, plan.updates)
        if plan.attention is not None:
            _select_attention(model, plan.attention)
        for module, change in plan.changes:
            if all(module is not entry.module for entry in applied.modules):
                applied.modules.append(_ModuleState(ModuleRef(module), _snapshot(module)))
            change(module)
    except BaseException:
        for entry in applied.modules:  # what the changes so far did, put back
            _finish(entry)
        _restore(model, applied)
        raise
    for entry in applied.modules:
        _finish(entry)
    state = model.state_dict()
    applied.added = frozenset(state) - names_before
    applied.initial = {name: state[name].detach().clone() for name in applied.added}
    model.__dict__[_APPLIED] = applied


def _select_attention(model: nn.Module, name: str) -> None:
    """Select the attention implementation ``name`` through transformers' ``set_attn_implementation``. A name holding
    "flash" (log-n's wrapper of a flash implementation), which that function takes for a Hub kernel to download, is
    set on the config as that function sets it. ``RuntimeError`` where the model does not take it."""
    if "flash" in name:
        setattr(model.config, ATTENTION, name)
    else:
        model.set_attn_implementation(name)
    if model.config._attn_implementation != name:
        raise RuntimeError(
            f"transformers did not select the attention implementation {name!r} for {type(model).__name__} (it "
            "cannot set one on this model); the model is left as it was."
        )


def _restore(model: nn.Module, applied: _AppliedPatch) -> None:
    config = model.config
    for key, value in applied.config_before.items():
        if value is _MISSING:
            config.__dict__.pop(key, None)
        else:
            set_config_attribute(config, key, copy.deepcopy(value))
    for entry in applied.modules:
        _restore_module(entry)


def _restore_module(entry: _ModuleState) -> None:
    """Put back what the patch changed on ``entry.module``, and nothing else: an attribute it replaced, added or
    removed; an entry of a dict or set it changed (a buffer, a submodule, a hook), its tensors following the
    moves the model made since."""
    module, before = entry.module, entry.before
    if module is None:  # swapped out of the model since, and dropped: nothing of the model to put back
        return
    current = _tensors(module)
    attributes = module.__dict__
    for key, entries in entry.changed.items():
        old = before.get(key, _MISSING)
        if entries is None or key not in attributes:
            if old is _MISSING:
                attributes.pop(key, None)
            else:
                attributes[key] = old
        elif isinstance(old, set):
            attributes[key] -= entries - old
            attributes[key] |= entries & old
        else:
            for name in entries:
                value = old.get(name, _MISSING)
                if value is _MISSING:
                    attributes[key].pop(name, None)
                else:
                    in_tensors = key in ("_buffers", "_parameters")
                    attributes[key][name] = _followed(current, name, value) if in_tensors else value


def patch(model: nn.Module, method: str | MethodSpec, **params: Any) -> nn.Module:
    """Change how ``model`` encodes position, in place.

    Args:
        model (`torch.nn.Module`): a loaded transformers causal LM: a RoPE decoder (Llama, Mistral, Qwen2/3,
            or any decoder whose RoPE comes from a rotary-embedding module), or GPT-2 (learned positions:
            ``alibi``, ``nope``, ``pi``, ``sinusoidal``, ``t5-bias``).
        method (`str` or `MethodSpec`): one of :func:`hf_posenc.available_methods` (or an alias such as
            ``"linear"``), or a :class:`~hf_posenc.spec.MethodSpec` parsed already
            (``MethodSpec.parse("yarn:factor=4")``), which carries its parameters.
        **params: the method's parameters, e.g. ``factor=4`` (none with a ``MethodSpec``). RoPE methods'
            ``original_max_position_embeddings`` defaults to the one the config records, else to its
            ``max_position_embeddings`` (logged).

    Returns:
        The same ``model``, patched; ``model.config`` now describes the method. A wrapper (a peft ``PeftModel``, a
        compiled model) is returned as given, the model it wraps patched and holding the record.

    Raises:
        ValueError: unknown method, bad value, unsupported architecture.
        TypeError: unknown or missing parameter, or parameters beside a ``MethodSpec``.
        RuntimeError: the model is already patched.

    On any error the model is left exactly as it was.
    """
    registered, built = _method_and_params(method, params)
    inner = unwrapped(model)
    with _lock_of(inner):
        plan = plan_patch(inner, registered, built)
        _apply(inner, plan)
        logger.debug("hf_posenc: patched %s with %s %s", type(inner).__name__, plan.info.method, plan.info.params)
    return model


def _method_and_params(method: str | MethodSpec, params: dict[str, Any]) -> tuple[Method, Any]:
    """The registered method and its parameters, built (so checked) once: from a name and keyword arguments, or
    from a parsed spec, which built them when parsed."""
    if not isinstance(method, MethodSpec):
        registered = get_method(method)
        return registered, registered.make_params(**params)
    if params:
        raise TypeError(
            f"patch() takes the parameters of {method.text!r} from the MethodSpec; got {', '.join(params)} too."
        )
    if method.unpatched:
        raise ValueError("MethodSpec 'none' is the unpatched model: there is nothing to patch with.")
    return get_method(method.method), method.built


@dataclass(frozen=True)
class DryRun:
    """What :func:`patch` would do to a model, found without changing it.

    Attributes:
        info (`PatchInfo`): what :func:`get_patch` would report: the parameters as resolved on the model.
        table_rows (`int`, *optional*): the rows of the learned position table the patched model would look
            positions up in (:func:`learned_table_rows`); None where any length runs.
        updates (`dict`): the config attributes the patch would set, to their values.
    """

    info: PatchInfo
    table_rows: int | None
    updates: dict[str, Any]

    def config(self, config: PretrainedConfig) -> PretrainedConfig:
        """A copy of ``config`` as the patched model's would read (``config`` itself unchanged)."""
        return updated_config(config, self.updates)


def dry_run(model: nn.Module, method: str | MethodSpec, **params: Any) -> DryRun:
    """Validate ``method`` on ``model`` and resolve its parameters, as :func:`patch` would, changing nothing.

    Raises:
        ValueError: as :func:`patch` raises it.
        TypeError: as :func:`patch` raises it.
        RuntimeError: the model is already patched.
    """
    registered, built = _method_and_params(method, params)
    inner = unwrapped(model)
    with _lock_of(inner):
        plan = plan_patch(inner, registered, built)
    rows = _table_rows(inner, plan.info.method, plan.updates)
    return DryRun(plan.info, rows, copy.deepcopy(plan.updates))


def unpatch(model: nn.Module) -> nn.Module:
    """Undo :func:`patch`: config, buffers, parameters, attributes and forward exactly as before. Returns ``model``."""
    inner = unwrapped(model)
    with _lock_of(inner):
        applied = _applied(inner)
        if applied is None:
            record = PatchRecord.from_config(getattr(inner, "config", None), missing_ok=True)
            if record and not record.baked:
                raise RuntimeError(
                    "This model's config carries an hf_posenc patch, but hf_posenc neither patched nor loaded this "
                    "model object (loaded with plain transformers, or a shallow copy of a patched model), so it "
                    "keeps nothing to unpatch; load it with hf_posenc.from_pretrained(...), or unpatch the model it "
                    "was copied from."
                )
            raise RuntimeError("This model is not patched by hf_posenc; there is nothing to unpatch.")
        _restore(inner, applied)
        del inner.__dict__[_APPLIED]
    return model


def get_patch(model: nn.Module) -> PatchInfo | None:
    """The method applied to ``model`` and its fully resolved parameters, or None. For ALiBi the backend
    is the one running now (``set_attn_implementation`` may have switched it)."""
    model = unwrapped(model)
    applied = _applied(model)
    if applied is None:
        return None
    return applied.info if applied.report is None else applied.report(model, applied.info)


def added_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state-dict entries the patch applied to ``model`` added (the T5 bias table), by name; empty for a model
    that is not patched or whose patch added none. What a checkpoint holds beyond the base model's."""
    model = unwrapped(model)
    applied = _applied(model)
    if applied is None or not applied.added:
        return {}
    state = model.state_dict()
    return {name: state[name] for name in sorted(applied.added)}


def trained_tensors(model: nn.Module) -> list[str]:
    """The names of :func:`added_tensors` whose values are no longer the patch's start (trained, or restored from
    a checkpoint): what a repo without the weights would not give back. Meta tensors hold no values: none."""
    model = unwrapped(model)
    applied = _applied(model)
    if applied is None:
        return []
    current = added_tensors(model)
    return [
        name
        for name, start in applied.initial.items()
        if not start.is_meta and not torch.equal(current[name], start.to(current[name]))  # after model.to(...)
    ]


def learned_table_rows(model: nn.Module) -> int | None:
    """The rows of the learned table (GPT-2's ``wpe``) ``model``, as patched, looks positions up in; None where
    any length runs: RoPE, and the methods that replace the table (ALiBi, NoPE, sinusoidal, the T5 bias)."""
    model = unwrapped(model)
    applied = get_patch(model)
    return _table_rows(model, None if applied is None else applied.method, {})


def _table_rows(model: nn.Module, method: str | None, updates: dict[str, Any]) -> int | None:
    """:func:`learned_table_rows` of ``model`` with ``method`` (None: unpatched) and the config ``updates`` of its
    plan still to apply (GPT-2's ``n_positions`` after ``pi``)."""
    if positions_of(model).kind != "learned" or (method is not None and get_method(method).role == "replace"):
        return None
    return updates.get("n_positions", model.config.max_position_embeddings)  # GPT-2's n_positions


@contextlib.contextmanager
def patched(model: nn.Module, method: str | MethodSpec, **params: Any) -> Iterator[nn.Module]:
    """``with hf_posenc.patched(model, "yarn", factor=4): ...`` — unpatched on exit, even on error."""
    patch(model, method, **params)
    try:
        yield model
    finally:
        unpatch(model)
