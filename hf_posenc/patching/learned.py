"""Planner: learned position tables. Position Interpolation of GPT-2's ``wpe``."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..architectures import position_table
from ..methods.pi import interpolate_positions
from ..record import CONFIG_KEY, PatchRecord
from ..registry import Method, params_to_dict, with_context
from .plan import PatchInfo, Plan, Planner


def plan_learned_pi(model: nn.Module, method: Method, params: Any) -> Plan:
    """``pi`` on GPT-2: ``wpe`` resampled to ``round(factor * n_positions)`` rows, ``n_positions`` updated, and
    ``n_ctx`` where the config has it (GPT-2's released configs do; llama.cpp's converter reads its context from it).

    The result is a plain GPT-2 with a longer table, so the config is native and the saved model loads
    the same with or without hf_posenc; its record is marked ``baked`` (nothing to redo on load).
    """
    table = position_table(model)
    rows = table.num_embeddings
    given = params.original_max_position_embeddings
    if given is not None and given != rows:
        raise ValueError(
            f"original_max_position_embeddings={given!r} but GPT-2's position table has {rows} rows; "
            "leave it out for learned positions."
        )
    resolved = with_context(params, rows)
    weight = interpolate_positions(table.weight.detach(), resolved.factor)  # (L', D)
    info = PatchInfo(method.name, params_to_dict(resolved), native=True, rope_type=None)
    lengths = ("n_positions", "n_ctx") if hasattr(model.config, "n_ctx") else ("n_positions",)
    base = {key: getattr(model.config, key) for key in lengths}
    record = PatchRecord(method.name, info.params, True, base, baked=True)
    updates = {**dict.fromkeys(lengths, weight.shape[0]), CONFIG_KEY: record.to_dict()}

    def resample(module: nn.Module) -> None:
        module.weight = nn.Parameter(weight, requires_grad=module.weight.requires_grad)
        module.num_embeddings = weight.shape[0]

    return Plan(info, updates, [(table, resample)])


def is_pi(method: Method) -> bool:
    return method.name == "pi"


PLANNER = Planner(positions=frozenset({"learned"}), serves=is_pi, plan=plan_learned_pi)
