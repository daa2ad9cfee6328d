"""Planner: RoPE scaling. New frequencies in each rotary module, the method in the config's ``rope_parameters``."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from ..architectures import rope_modules, rotary_dim, trained_context
from ..methods import compute_frequencies
from ..registry import Method, get_method, params_to_dict, with_context
from .changes import refuse_unsavable_config, updated_config
from .plan import PatchInfo, Plan, Planner, unpatched_tensor
from .rope_types import (
    OWN_ROPE_TYPE,
    native_rope_parameters,
    own_rope_parameters,
    rope_config_updates,
    transformers_frequencies,
)

logger = logging.getLogger("hf_posenc")

NATIVE_RTOL = 1e-5  # transformers' float32 math against ours in float64


def _probe_lengths(method: Method, context: int) -> list[int | None]:
    return [None, context, context + 1, 2 * context, 4 * context + 3] if method.dynamic else [None]


def _native_problem(patched_config: Any, rotary_class: type, ours: Callable, lengths: list[int | None]) -> str | None:
    """Why transformers' own function for the native config does not give our formula at every length (it
    differs, or fails on this config: Mixtral's ``head_dim: null`` in its yarn and dynamic functions), or None."""
    for seq_len in lengths:
        try:
            theirs, their_factor = transformers_frequencies(patched_config, rotary_class, seq_len)
        except (TypeError, ValueError, ZeroDivisionError) as error:
            return f"fails on this config ({type(error).__name__}: {error})"
        expected, factor = ours(seq_len)
        if not torch.allclose(theirs.double(), expected, rtol=NATIVE_RTOL, atol=0) or abs(
            their_factor - factor
        ) > 1e-6 * max(1.0, abs(factor)):
            return "does not reproduce it for these parameters"
    return None


MSCALE_PAIR = ("mscale", "mscale_all_dim")


def _native_forms(rope_parameters: dict[str, Any]) -> list[dict[str, Any]]:
    """The native ``rope_parameters`` to try: as written, then without the mscale pair (for SGLang and TGI), which
    some families' attention reads besides the rotation (:func:`_attention_problem`)."""
    if not any(key in rope_parameters for key in MSCALE_PAIR):
        return [rope_parameters]
    return [rope_parameters, {key: value for key, value in rope_parameters.items() if key not in MSCALE_PAIR}]


def _attention_problem(model: nn.Module, candidate: Any) -> str | None:
    """Why the attention transformers builds from the patched config would not be the model's, or None. A patch
    changes the rotary modules only, but some families' attention reads the RoPE parameters when built:
    DeepSeek-V2/V3 multiply the softmax scale by YaRN's ``(0.1 mscale_all_dim ln s + 1)^2``. One layer's attention
    is built on the meta device from each config and their ``scaling`` compared."""
    attention = next(
        (m for m in model.modules() if hasattr(m, "scaling") and hasattr(m, "layer_idx") and hasattr(m, "config")),
        None,
    )
    if attention is None:
        return None
    name = type(attention).__name__
    try:
        before = _meta_attention(attention, model.config).scaling
    except (TypeError, AttributeError):  # built from other arguments, or from a sub-config: nothing to compare
        return None
    try:
        after = _meta_attention(attention, candidate).scaling
    except (TypeError, ValueError, KeyError, ZeroDivisionError) as error:
        return f"makes {name} fail ({type(error).__name__}: {error})"
    return None if after == before else f"also makes {name} scale its softmax by {after / before:.6g}"


def _meta_attention(attention: nn.Module, config: Any) -> nn.Module:
    """A new ``type(attention)`` of the same layer built from ``config`` on the meta device: no memory, no values."""
    with torch.device("meta"):
        return type(attention)(config, layer_idx=attention.layer_idx)


def plan_rope_scaling(model: nn.Module, method: Method, params: Any) -> Plan:
    """Validate a RoPE scaling method (``params``: its parameters, built) on ``model`` and plan it, without changing
    the model."""
    modules = rope_modules(model)
    config = model.config
    resolved = with_context(params, trained_context(config, params.original_max_position_embeddings))
    head_dim, base = rotary_dim(config), config.rope_parameters["rope_theta"]

    source = FrequencySource(method.name, resolved, head_dim, base)
    ours = source.formula
    lengths = _probe_lengths(method, resolved.context)
    for seq_len in lengths:  # raises on inputs only checkable against the model (e.g. list lengths)
        ours(seq_len)
    rope_parameters = native_rope_parameters(method, resolved, config)
    native = False  # transformers has a rope type for it (rope_parameters) and builds the patched model from it
    if rope_parameters is not None:
        for form in _native_forms(rope_parameters):
            updates = rope_config_updates(method, resolved, config, form)
            candidate = updated_config(config, updates)
            problem = _native_problem(candidate, type(modules[0]), ours, lengths)
            problem = problem or _attention_problem(model, candidate)
            if problem is None:
                rope_parameters, native = form, True
                break
    if not native:
        own = own_rope_parameters(method, resolved, config)
        if rope_parameters is not None:
            logger.warning(
                "hf_posenc: transformers' rope_type %r for %r %s; recording it under rope_type %r instead "
                "(needs hf_posenc to load).",
                rope_parameters["rope_type"],
                method.name,
                problem,
                own["rope_type"],
            )
        rope_parameters = own
        updates = rope_config_updates(method, resolved, config, rope_parameters)
    refuse_unsavable_config(updated_config(config, updates), method)
    info = PatchInfo(method.name, params_to_dict(resolved), native, rope_parameters["rope_type"])
    if native:  # transformers' function on this patch's config (a copy: a combination marks the live one)
        source = dataclasses.replace(source, transformers_rotary=(candidate, type(modules[0])))
    # What the patched modules report as rope_type: transformers' dynamic decorator skips both kinds,
    # and its weight init rebuilds them exactly (a native static type, or ours from the config record).
    rope_type = info.rope_type if native and not method.dynamic else OWN_ROPE_TYPE
    change = functools.partial(_rescale, method, resolved, source, rope_type)
    return Plan(info, updates, [(module, change) for module in modules])


@dataclass(eq=False)
class FrequencySource:
    """``(seq_len, device) -> (inv_freq float32, attention factor)`` for a patched model's rotary modules.

    Native patches use transformers' own function on the patched config (a copy made when planning), so the
    patched model is bit for bit what ``from_pretrained`` builds from the saved config; the others use our
    math. Plain data, no closures: ``copy.deepcopy(model)`` and pickling copy it along.
    """

    method: str
    params: Any
    head_dim: int
    base: float
    transformers_rotary: tuple[Any, type] | None = None  # (a copy of the patched config, the rotary class)

    def formula(self, seq_len: int | None) -> tuple[torch.Tensor, float]:
        """Our math in float64 (:mod:`hf_posenc.methods`)."""
        method = get_method(self.method)
        return compute_frequencies(method, self.params, head_dim=self.head_dim, base=self.base, seq_len=seq_len)

    def __call__(self, seq_len: int | None, device: torch.device | None) -> tuple[torch.Tensor, float]:
        if self.transformers_rotary is not None:
            return transformers_frequencies(*self.transformers_rotary, seq_len, device)
        inv_freq, factor = self.formula(seq_len)
        return inv_freq.to(device=device, dtype=torch.float32), factor


def _rescale(method: Method, params: Any, source: FrequencySource, rope_type: str, module: nn.Module) -> None:
    original_scaling = getattr(module, "attention_scaling", 1.0)
    inv_freq, factor = source(None, module.inv_freq.device)
    module.inv_freq = inv_freq
    module.original_inv_freq = inv_freq.clone()
    module.attention_scaling = factor
    module.rope_type = rope_type
    if method.dynamic:
        hook = PerCallFrequencies(source, params.context, method.unchanged_within_context, original_scaling)
        module.register_forward_pre_hook(hook, with_kwargs=True)


@dataclass(eq=False)
class PerCallFrequencies:
    """Forward pre-hook of a rotary module under a dynamic method: sets the frequencies for this call's
    length, ``max(position) + 1``, before the module's own forward runs.

    Stateless: the result depends on the current length only (not on earlier calls). With a KV cache each
    token is rotated with the frequencies of the length at which it was written. The module gets its own
    copy each call, so in-place writes to ``inv_freq`` (transformers' weight init does them) reach neither
    the cache here nor what ``unpatch`` restores. The copy keeps the dtype ``inv_freq`` has when the call
    comes. Within ``L`` where the method is the unpatched model it is the unpatched frequencies as the module keeps
    them (:func:`~hf_posenc.patching.plan.unpatched_tensor`): moved and rounded by every ``model.to`` as the
    unpatched model's, so that the two stay equal after ``.to(torch.bfloat16).to(torch.float32)`` too.
    """

    source: FrequencySource
    context: int
    unchanged_within_context: bool
    original_scaling: float  # the unpatched module's attention scaling
    cache: dict[tuple[int, torch.device, torch.dtype], tuple[torch.Tensor, float]] = field(
        default_factory=dict, repr=False
    )

    CACHE_SIZE: ClassVar[int] = 8

    def frequencies(self, seq_len: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
        key = (seq_len, device, dtype)
        if key not in self.cache:
            if len(self.cache) >= self.CACHE_SIZE:
                del self.cache[next(iter(self.cache))]  # the oldest length
            inv_freq, factor = self.source(seq_len, device)
            self.cache[key] = inv_freq.to(device=device, dtype=dtype), factor
        return self.cache[key]

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        x = args[0] if args else kwargs["x"]
        position_ids = args[1] if len(args) > 1 else kwargs["position_ids"]
        length = int(position_ids.max()) + 1
        if self.unchanged_within_context and length <= self.context:
            inv_freq, module.attention_scaling = unpatched_tensor(module, "inv_freq"), self.original_scaling
        else:
            inv_freq, module.attention_scaling = self.frequencies(length, x.device, module.inv_freq.dtype)
        module.inv_freq = inv_freq.clone()


def rescales_rope(method: Method) -> bool:
    """The methods this planner serves: those with RoPE frequencies."""
    return method.frequencies is not None


PLANNER = Planner(positions=frozenset({"rope"}), serves=rescales_rope, plan=plan_rope_scaling)
