"""Module changes more than one planner makes (planners never import each other; they share these)."""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
from torch import nn

from ..architectures import PLAIN_ATTENTION_ROPE_MODEL_TYPES, position_table, positions_of, rope_modules
from ..record import CONFIG_KEY, PatchRecord, set_config_attribute
from ..registry import Method
from .plan import ModuleChange, PatchInfo
from .rope_types import OWN_ROPE_TYPE, replaced_marker


def masks_in_forward(model: nn.Module) -> None:
    """``generate()`` with a compileable (static) cache builds the attention masks before calling the model,
    and then needs tensors (it calls ``.contiguous()``; the forward passes on only 4D tensors and block
    masks as prepared). Masks that are neither (ALiBi's flex and cudnn masks, the extension methods' positions)
    cannot go that way, so for this model generate() passes the 2D mask on and the forward builds them, as it
    does with a dynamic cache."""
    model.create_masks_for_generate = _keep_2d_mask


def _keep_2d_mask(*, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor | None:
    return attention_mask


def set_updates(config: Any, updates: dict[str, Any]) -> None:
    """Set each of a patch's config ``updates`` (a copy of its value, which transformers may standardize in place)
    as the saved config will hold it (:func:`~hf_posenc.record.set_config_attribute`)."""
    for key, value in updates.items():
        set_config_attribute(config, key, copy.deepcopy(value))


def updated_config(config: Any, updates: dict[str, Any]) -> Any:
    """A copy of ``config`` with a patch's updates: what the patched model's config will be."""
    candidate = copy.deepcopy(config)
    set_updates(candidate, updates)
    return candidate


def refuse_unsavable_config(candidate: Any, method: Method) -> None:
    """transformers validates a config's RoPE parameters when it is saved, and some config classes accept
    only a few rope types (Phi-3: ``default`` and ``longrope``): refuse at patch time what could not be saved."""
    try:
        candidate.validate_rope()
    except (ValueError, TypeError, KeyError) as error:
        rope_type = candidate.rope_parameters["rope_type"]
        raise ValueError(
            f"{type(candidate).__name__} refuses the config that method {method.name!r} writes (rope_type "
            f"{rope_type!r}), so the patched model could not be saved: {error}"
        ) from None


def positions_removed(
    model: nn.Module, method: Method, *, in_attention: bool = True
) -> tuple[dict[str, Any], list[tuple[nn.Module, ModuleChange]], str | None]:
    """What makes the model's own positions contribute nothing, for a method that replaces them (ALiBi, NoPE,
    the T5 bias): ``(config updates, module changes, rope_type written)``.

    RoPE decoders: every rotation the identity (:func:`no_rotation`), ``rope_type`` the method's marker. GPT-2:
    ``wpe`` gives zeros at any position (:func:`no_positions`), ``activation_function`` the marker. No rope init
    function or activation has that name, so plain transformers refuses the saved config (``KeyError``) rather
    than load the original encoding; the record keeps the base values, which hf_posenc puts back. A method that
    works ``in_attention`` (a bias) applies to the RoPE families whose attention is plain only; NoPE, which leaves
    attention alone, to any RoPE decoder hf_posenc finds the rotary modules of.
    """
    marker = replaced_marker(method)
    if positions_of(model).kind != "rope":
        return {"activation_function": marker}, [(position_table(model), no_positions)], None
    model_type = model.config.model_type
    if in_attention and model_type not in PLAIN_ATTENTION_ROPE_MODEL_TYPES:
        raise ValueError(
            f"{method.name!r} replaces RoPE in {', '.join(PLAIN_ATTENTION_ROPE_MODEL_TYPES)} models (and GPT-2's "
            f"learned positions); {type(model).__name__} (model_type {model_type!r}) is not one of them: its attention "
            "may add terms or not go through transformers' attention interface, so the result could be silently wrong."
        )
    rotary = rope_modules(model, scaled_ok=True, bases_differ_ok=True)  # no rotation left: scale and base are moot
    updates = {"rope_parameters": {**model.config.rope_parameters, "rope_type": marker}}
    refuse_unsavable_config(updated_config(model.config, updates), method)  # Phi-3's class: default, longrope only
    return updates, [(module, no_rotation) for module in rotary], marker


def replacement_updates(
    model: nn.Module,
    method: Method,
    params: dict[str, Any],
    config_changes: dict[str, Any],
    rope_type: str | None,
    *,
    recorded: dict[str, Any] | None = None,
) -> tuple[PatchInfo, dict[str, Any]]:
    """What ``get_patch`` reports of a method that replaces the encoding, and the config updates: ``config_changes``
    and the record, which keeps the base value of each changed attribute and ``params`` with ``recorded`` over
    them."""
    info = PatchInfo(method.name, params, native=False, rope_type=rope_type)
    base = {key: getattr(model.config, key) for key in config_changes}
    record = PatchRecord(method.name, {**params, **(recorded or {})}, False, base)
    return info, {**config_changes, CONFIG_KEY: record.to_dict()}


def no_rotation(module: nn.Module) -> None:
    """The identity rotation: ``inv_freq = 0``, so ``cos = 1`` and ``sin = 0`` exactly."""
    module.inv_freq = torch.zeros_like(module.inv_freq)
    module.original_inv_freq = module.inv_freq.clone()
    module.attention_scaling = 1.0
    module.rope_type = OWN_ROPE_TYPE  # transformers' dynamic update skips it; its weight init gives zeros


def no_positions(module: nn.Module) -> None:
    """GPT-2's ``wpe`` looks every position up as row 0 (any length runs) and returns zeros. Hooks (module-level
    functions) rather than a new forward, so ``copy.deepcopy(model)`` and pickling keep them bound to the copy."""
    module.register_forward_pre_hook(_row_zero)
    module.register_forward_hook(_zeros)


def _row_zero(module: nn.Module, args: tuple) -> tuple:
    return tuple(torch.zeros_like(arg) if isinstance(arg, torch.Tensor) else arg for arg in args)


def _zeros(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(output)


def check_implementation_before_calls(serving: tuple[str, ...]) -> ModuleChange:
    """A change adding a check before each call of an attention module that one of the ``serving`` implementations
    is still selected: ``set_attn_implementation("sdpa")`` would silently drop the method."""
    return functools.partial(_add_check, serving)


def _add_check(serving: tuple[str, ...], module: nn.Module) -> None:
    module.register_forward_pre_hook(functools.partial(_check_implementation, serving))


def _check_implementation(serving: tuple[str, ...], module: nn.Module, args: tuple) -> None:
    selected = module.config._attn_implementation
    if selected not in serving:
        method = PatchRecord.from_config(module.config).method
        raise RuntimeError(
            f"This model is patched with {method!r}, but its attention implementation is now {selected!r}, which "
            f"does not apply it (set_attn_implementation?). Select one of {', '.join(serving)}, or call "
            "hf_posenc.unpatch(model) first."
        )


def trains_with_dropout(model: nn.Module) -> bool:
    """Whether ``model`` is in training mode with attention dropout (GPT-2: ``attn_pdrop``; Llama and others:
    ``attention_dropout``), which the flex and cudnn bias backends and the remaps' backends do not have."""
    config = model.config
    return model.training and bool(getattr(config, "attn_pdrop", 0.0) or getattr(config, "attention_dropout", 0.0))


def refuse_training_dropout(model: nn.Module, backend: str, other: str = "") -> None:
    """Raise ``ValueError`` if ``model`` trains with attention dropout, which ``backend`` (a phrase naming the
    attention, ``"The alibi flex backend"``) has none of: at patch time, before a training run writes anything.
    ``other``: a backend that has it, offered first."""
    if trains_with_dropout(model):
        offer = f"use backend={other!r}, " if other else ""
        raise ValueError(
            f"{backend} has no attention dropout, and this model is in training mode with attention dropout: "
            f"{offer}set the dropout to 0, or call model.eval() before patching."
        )


class NoCounterpart(ValueError):
    """An ``attn_implementation`` asked for at load that this model's patch cannot run; ``standard``: the
    transformers names that serve (each picks the patch's backend of its kind)."""

    def __init__(self, asked: str, standard: list[str], own: list[str]):
        super().__init__(
            f"attn_implementation={asked!r} has no counterpart for this model's patch; use one of "
            f"{', '.join([*standard, *own])}."
        )
        self.asked, self.standard, self.own = asked, standard, own

    def __reduce__(self):  # pickled and copied with the arguments it was made from, not its message
        return type(self), (self.asked, self.standard, self.own)
