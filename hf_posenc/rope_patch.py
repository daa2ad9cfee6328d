"""Planner for the RoPE scaling methods: new frequencies in each rotary module, the method in the config."""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .architectures import rotary_dim, rotary_modules
from .config import (
    OWN_ROPE_TYPE,
    config_updates,
    native_rope_parameters,
    own_rope_parameters,
    params_to_dict,
    transformers_frequencies,
)
from .plan import PatchInfo, Plan
from .registry import Method

logger = logging.getLogger("hf_posenc")

NATIVE_RTOL = 1e-5  # transformers' float32 math against ours in float64

Frequencies = Callable[[int | None, torch.device | None], tuple[torch.Tensor, float]]


def check_rope_model(model: nn.Module) -> list[nn.Module]:
    """The rotary modules of a model trained with one set of plain RoPE parameters, or ``ValueError``."""
    modules = [module for _, module in rotary_modules(model)]
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


def plan_rope_scaling(model: nn.Module, method: Method, params: dict[str, Any]) -> Plan:
    """Validate a RoPE scaling method on ``model`` and plan it, without changing the model."""
    modules = check_rope_model(model)
    config = model.config
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
        updates = config_updates(method, resolved, config, rope_parameters)
        candidate = copy.deepcopy(config)
        for key, value in updates.items():
            setattr(candidate, key, copy.deepcopy(value))  # transformers may standardize it in place
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
    info = PatchInfo(method.name, params_to_dict(resolved), native, rope_parameters["rope_type"])
    source = _frequency_source(ours, native, modules[0], config)
    # What the patched modules report as rope_type: transformers' dynamic decorator skips both kinds,
    # and its weight init rebuilds them exactly (a native static type, or ours from the config record).
    rope_type = info.rope_type if native and not method.dynamic else OWN_ROPE_TYPE
    change = functools.partial(_rescale, method, resolved, source, rope_type)
    return Plan(info, updates, [(module, change) for module in modules])


def _frequency_source(ours: Callable, native: bool, module: nn.Module, config: Any) -> Frequencies:
    """``(seq_len, device) -> (inv_freq float32, attention factor)`` for the patched model.

    Native patches use transformers' own function on the patched config (read when called, after the
    config updates), so the patched model is bit for bit what ``from_pretrained`` builds from the saved
    config; the others use our math.
    """
    if native:
        return lambda seq_len, device: transformers_frequencies(config, module, seq_len, device)

    def ours_float32(seq_len, device):
        inv_freq, factor = ours(seq_len)
        return inv_freq.to(device=device, dtype=torch.float32), factor

    return ours_float32


def _rescale(method: Method, params: Any, source: Frequencies, rope_type: str, module: nn.Module) -> None:
    original = module.inv_freq, getattr(module, "attention_scaling", 1.0)
    inv_freq, factor = source(None, module.inv_freq.device)
    module.inv_freq = inv_freq
    module.original_inv_freq = inv_freq.clone()
    module.attention_scaling = factor
    module.rope_type = rope_type
    if method.dynamic:
        module.forward = _dynamic_forward(module, source, method, params, original)


def _dynamic_forward(
    module: nn.Module, source: Frequencies, method: Method, params: Any, original: tuple[torch.Tensor, float]
):
    """An instance-level forward that sets the frequencies for this call's length, ``max(position) + 1``.

    Stateless: the result depends on the current length only (not on earlier calls). With a KV
    cache each token is rotated with the frequencies of the length at which it was written.
    """
    class_forward = type(module).forward
    context = params.context

    @functools.lru_cache(maxsize=8)
    def frequencies(seq_len: int, device: torch.device) -> tuple[torch.Tensor, float]:
        if method.unchanged_within_context and seq_len <= context:
            return original[0].to(device), original[1]
        inv_freq, factor = source(seq_len, device)
        return inv_freq.to(device=device, dtype=torch.float32), factor

    def forward(x: torch.Tensor, position_ids: torch.Tensor, *args: Any, **kwargs: Any):
        module.inv_freq, module.attention_scaling = frequencies(int(position_ids.max()) + 1, x.device)
        return class_forward(module, x, position_ids, *args, **kwargs)

    return forward
