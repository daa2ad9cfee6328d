"""Planner for Position Interpolation of a learned absolute table (GPT-2 ``wpe``), and the table lookup."""

from __future__ import annotations

from typing import Any

from torch import nn

from .architectures import positions_of
from .config import CONFIG_KEY, params_to_dict, patch_record
from .methods.pi import interpolate_positions
from .plan import PatchInfo, Plan
from .registry import Method


def gpt2_position_table(model: nn.Module) -> nn.Embedding:
    """GPT-2's ``wpe``; other learned-position families raise (their attention is not dispatched alike)."""
    model_type = model.config.model_type
    if model_type != "gpt2":
        raise ValueError(
            f"hf_posenc patches learned positions of GPT-2 only (model_type 'gpt2'); this model is {model_type!r}."
        )
    if getattr(model.config, "add_cross_attention", False):
        raise ValueError("GPT-2 with cross-attention (add_cross_attention=True) is not supported.")
    root = getattr(model, "base_model", model)
    return root.get_submodule(positions_of(model).where.removeprefix(f"{root.base_model_prefix}."))


def plan_learned_pi(model: nn.Module, method: Method, params: dict[str, Any]) -> Plan:
    """``pi`` on GPT-2: ``wpe`` resampled to ``round(factor * n_positions)`` rows, ``n_positions`` updated.

    The result is a plain GPT-2 with a longer table, so the config is native and the saved model loads
    the same with or without hf_posenc; its record is marked ``baked`` (nothing to redo on load).
    """
    table = gpt2_position_table(model)
    rows = table.num_embeddings
    given = params.pop("original_max_position_embeddings", None)
    if given is not None and given != rows:
        raise ValueError(
            f"original_max_position_embeddings={given!r} but GPT-2's position table has {rows} rows; "
            "leave it out for learned positions."
        )
    resolved = method.make_params(original_max_position_embeddings=rows, **params)
    weight = interpolate_positions(table.weight.detach(), resolved.factor)  # (L', D)
    info = PatchInfo(method.name, params_to_dict(resolved), native=True, rope_type=None)
    updates = {
        "n_positions": weight.shape[0],
        CONFIG_KEY: patch_record(method.name, info.params, True, {"n_positions": rows}, baked=True),
    }

    def resample(module: nn.Module) -> None:
        module.weight = nn.Parameter(weight, requires_grad=module.weight.requires_grad)
        module.num_embeddings = weight.shape[0]

    return Plan(info, updates, [(table, resample)])
