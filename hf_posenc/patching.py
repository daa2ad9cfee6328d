"""The only module that changes a model: plan a patch, apply it, record it, restore it.

Everything a patch changes is recorded per model instance (config attributes, the rotary modules'
attributes and buffers) and ``unpatch`` puts back exactly that. Classes and transformers modules are
never touched, so two models in one process do not affect each other.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .architectures import positions_of, rotary_dim, rotary_modules, unsupported
from .config import (
    CONFIG_KEY,
    OWN_ROPE_TYPE,
    config_updates,
    native_rope_parameters,
    own_rope_parameters,
    params_to_dict,
    transformers_frequencies,
)
from .registry import Method, get_method

logger = logging.getLogger("hf_posenc")

NATIVE_RTOL = 1e-5  # transformers' float32 math against ours in float64
_MISSING = object()

Frequencies = Callable[[int | None, torch.device | None], tuple[torch.Tensor, float]]


@dataclass(frozen=True)
class PatchInfo:
    """What :func:`hf_posenc.get_patch` reports.

    Attributes:
        method (`str`): canonical method name.
        params (`dict`): every parameter, defaults and the trained context resolved.
        native (`bool`): the config says it in transformers' own vocabulary (loads without hf_posenc).
        rope_type (`str`): the ``rope_type`` written to ``config.rope_parameters``.
    """

    method: str
    params: dict[str, Any]
    native: bool
    rope_type: str

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "params": dict(self.params), "native": self.native, "rope_type": self.rope_type}


@dataclass
class _Record:
    info: PatchInfo
    config_before: dict[str, Any]
    modules_before: list[tuple[nn.Module, dict[str, Any]]] = field(default_factory=list)


_RECORDS: weakref.WeakKeyDictionary[nn.Module, _Record] = weakref.WeakKeyDictionary()


@dataclass
class _Plan:
    method: Method
    params: Any
    updates: dict[str, Any]
    modules: list[nn.Module]
    native: bool
    ours: Callable[[int | None], tuple[torch.Tensor, float]]  # our float64 math for this model


def _check_rope_model(model: nn.Module, method: Method) -> list[nn.Module]:
    positions = positions_of(model)
    modules = [module for _, module in rotary_modules(model)]
    if positions.kind != "rope" or "rope" not in method.applies_to or not modules:
        raise unsupported(model, method.name, positions)
    rope = getattr(model.config, "rope_parameters", None) or {}
    if "rope_type" not in rope:
        raise ValueError(
            f"{type(model).__name__} has per-layer RoPE parameters ({sorted(rope)}); hf_posenc patches "
            "models with one set of RoPE parameters."
        )
    if rope["rope_type"] != "default":
        raise ValueError(
            f"{type(model).__name__} already uses rope_type {rope['rope_type']!r}; hf_posenc patches models "
            "trained with plain RoPE (rope_type 'default'). Load the base model instead."
        )
    pairs = rotary_dim(model.config) // 2
    for module in modules:
        if module.inv_freq.numel() != pairs:
            raise ValueError(
                f"{type(module).__name__} holds {module.inv_freq.numel()} frequencies but the config implies "
                f"{pairs}; this architecture is not supported."
            )
    return modules


def _trained_context(config: Any, params: dict[str, Any]) -> int:
    """``L``: given, else recorded by the config (``original_max_position_embeddings``), else guessed
    from ``max_position_embeddings`` with a log line."""
    given = params.pop("original_max_position_embeddings", None)
    if given is not None:
        return given
    recorded = config.rope_parameters.get("original_max_position_embeddings") or getattr(
        config, "original_max_position_embeddings", None
    )
    if recorded:
        return recorded
    context = config.max_position_embeddings
    logger.warning(
        "hf_posenc: original_max_position_embeddings not given; using the config's max_position_embeddings "
        "= %d as the trained context L. Pass original_max_position_embeddings=... if that is not right.",
        context,
    )
    return context


def _probe_lengths(method: Method, context: int) -> list[int | None]:
    return [None, context, context + 1, 2 * context, 4 * context + 3] if method.dynamic else [None]


def _native_matches(plan_config: Any, module: nn.Module, ours: Callable, lengths: list[int | None]) -> bool:
    """Whether transformers' own function for the native config gives our formula at every length."""
    for seq_len in lengths:
        theirs, their_factor = transformers_frequencies(plan_config, module, seq_len)
        expected, factor = ours(seq_len)
        if not torch.allclose(theirs.double(), expected, rtol=NATIVE_RTOL, atol=0) or abs(
            their_factor - factor
        ) > 1e-6 * max(1.0, abs(factor)):
            return False
    return True


def _plan(model: nn.Module, method_name: str, params: dict[str, Any]) -> _Plan:
    """Validate everything and compute the patch without changing the model."""
    if model in _RECORDS:
        raise RuntimeError(
            f"This model is already patched with {_RECORDS[model].info.method!r}; call hf_posenc.unpatch(model) first."
        )
    config = model.config
    if getattr(config, CONFIG_KEY, None):
        raise RuntimeError(
            "This model's config already carries an hf_posenc patch but was not loaded through hf_posenc; "
            "load it with hf_posenc.from_pretrained(...) to get a model that can be unpatched."
        )
    method = get_method(method_name)
    modules = _check_rope_model(model, method)
    params = dict(params)
    resolved = method.make_params(original_max_position_embeddings=_trained_context(config, params), **params)
    head_dim, base = rotary_dim(config), config.rope_parameters["rope_theta"]

    def ours(seq_len):
        return method.frequencies(resolved, head_dim=head_dim, base=base, seq_len=seq_len)

    lengths = _probe_lengths(method, resolved.context)
    for seq_len in lengths:  # raises on inputs only checkable against the model (e.g. list lengths)
        ours(seq_len)
    rope_parameters = native_rope_parameters(method, resolved, config)
    native = rope_parameters is not None
    if native:
        candidate = copy.deepcopy(config)
        for key, value in config_updates(method, resolved, config, rope_parameters).items():
            setattr(candidate, key, value)
        native = _native_matches(candidate, modules[0], ours, lengths)
        if not native:
            logger.warning(
                "hf_posenc: transformers' rope_type %r does not reproduce %r for these parameters; recording "
                "it under rope_type %r instead (needs hf_posenc to load).",
                rope_parameters["rope_type"],
                method.name,
                OWN_ROPE_TYPE,
            )
    if not native:
        rope_parameters = own_rope_parameters(method, resolved, config)
    updates = config_updates(method, resolved, config, rope_parameters)
    return _Plan(method, resolved, updates, modules, native, ours)


def _frequency_source(plan: _Plan, config: Any) -> Frequencies:
    """``(seq_len, device) -> (inv_freq float32, attention factor)`` for the patched model.

    Native patches use transformers' own function on the patched config, so the patched model is
    bit for bit what ``from_pretrained`` builds from the saved config; the others use our math.
    """
    if plan.native:
        module = plan.modules[0]
        return lambda seq_len, device: transformers_frequencies(config, module, seq_len, device)

    def ours(seq_len, device):
        inv_freq, factor = plan.ours(seq_len)
        return inv_freq.to(device=device, dtype=torch.float32), factor

    return ours


def _dynamic_forward(module: nn.Module, source: Frequencies, plan: _Plan, before: dict[str, Any]):
    """An instance-level forward that sets the frequencies for this call's length, ``max(position) + 1``.

    Stateless: the result depends on the current length only (not on earlier calls). With a KV
    cache each token is rotated with the frequencies of the length at which it was written.
    """
    class_forward = type(module).forward
    context = plan.params.context
    original = before["_buffers"]["inv_freq"], before.get("attention_scaling", 1.0)

    @functools.lru_cache(maxsize=8)
    def frequencies(seq_len: int, device: torch.device) -> tuple[torch.Tensor, float]:
        if plan.method.unchanged_within_context and seq_len <= context:
            return original[0].to(device), original[1]
        inv_freq, factor = source(seq_len, device)
        return inv_freq.to(device=device, dtype=torch.float32), factor

    def forward(x: torch.Tensor, position_ids: torch.Tensor, *args: Any, **kwargs: Any):
        module.inv_freq, module.attention_scaling = frequencies(int(position_ids.max()) + 1, x.device)
        return class_forward(module, x, position_ids, *args, **kwargs)

    return forward


def _snapshot(module: nn.Module) -> dict[str, Any]:
    state = dict(module.__dict__)
    state["_buffers"] = dict(module._buffers)
    return state


def _apply(model: nn.Module, plan: _Plan) -> None:
    config = model.config
    record = _Record(
        info=PatchInfo(
            method=plan.method.name,
            params=params_to_dict(plan.params),
            native=plan.native,
            rope_type=plan.updates["rope_parameters"]["rope_type"],
        ),
        config_before={
            key: copy.deepcopy(config.__dict__[key]) if key in config.__dict__ else _MISSING for key in plan.updates
        },
    )
    try:
        for key, value in plan.updates.items():
            setattr(config, key, copy.deepcopy(value))
        source = _frequency_source(plan, config)
        # What the patched modules report as rope_type: transformers' dynamic decorator skips both
        # kinds, and its weight init rebuilds them exactly (native static type, or ours via the record).
        module_rope_type = record.info.rope_type if plan.native and not plan.method.dynamic else OWN_ROPE_TYPE
        for module in plan.modules:
            before = _snapshot(module)
            record.modules_before.append((module, before))
            inv_freq, factor = source(None, module.inv_freq.device)
            module.inv_freq = inv_freq
            module.original_inv_freq = inv_freq.clone()
            module.attention_scaling = factor
            module.rope_type = module_rope_type
            if plan.method.dynamic:
                module.forward = _dynamic_forward(module, source, plan, before)
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
        current = module._buffers
        buffers = {
            name: tensor
            if name not in current or current[name] is None
            else tensor.to(device=current[name].device, dtype=current[name].dtype)
            for name, tensor in before["_buffers"].items()
        }
        module.__dict__.clear()
        module.__dict__.update(before)
        module.__dict__["_buffers"] = buffers


def patch(model: nn.Module, method: str, **params: Any) -> nn.Module:
    """Change how ``model`` encodes position, in place.

    Args:
        model (`torch.nn.Module`): a loaded transformers causal LM (Llama, Mistral, Qwen2/3, or any
            decoder whose RoPE comes from a rotary-embedding module).
        method (`str`): one of :func:`hf_posenc.available_methods` (or an alias such as ``"linear"``).
        **params: the method's parameters, e.g. ``factor=4``. ``original_max_position_embeddings``
            defaults to the config's ``max_position_embeddings`` (logged).

    Returns:
        The same ``model``, patched; ``model.config`` now describes the method.

    Raises:
        ValueError / TypeError: unknown method or parameter, bad value, unsupported architecture.
        RuntimeError: the model is already patched.
        On any error the model is left exactly as it was.
    """
    plan = _plan(model, method, params)
    _apply(model, plan)
    logger.info("hf_posenc: patched %s with %s %s", type(model).__name__, plan.method.name, params_to_dict(plan.params))
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Undo :func:`patch`: config, buffers, attributes and forward exactly as before. Returns ``model``."""
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
