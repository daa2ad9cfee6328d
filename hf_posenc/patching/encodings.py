"""Planner: encodings that need no attention change. NoPE (RoPE's rotation or GPT-2's ``wpe`` removed) and the
sinusoidal table of Vaswani et al. 2017 in place of GPT-2's ``wpe``.

The attention implementation stays the model's own. Saved configs carry the method's marker (see
:func:`~hf_posenc.patching.changes.positions_removed`), so plain transformers refuses them rather than build
the original encoding.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import torch
from torch import nn

from ..architectures import position_table
from ..methods.sinusoidal import SINUSOID_RMS, sinusoidal_embedding
from ..registry import Method, params_to_dict
from .changes import positions_removed, replacement_updates
from .plan import ModuleChange, Plan, Planner
from .rope_types import replaced_marker


class SinusoidalPositions(nn.Module):
    """Stands where GPT-2's ``wpe`` was: ``scale * PE(p)`` (Vaswani et al. 2017, §3.5) for any position ``p``.

    It keeps the learned table as its ``weight`` (the same parameter, unused: it gets no gradient), so the
    checkpoint keeps its keys and a saved model's base weights stay whole.
    """

    def __init__(self, table: nn.Embedding, scale: float, base: float) -> None:
        super().__init__()
        self.weight = table.weight
        self.embedding_dim, self.scale, self.base = table.embedding_dim, scale, base

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        table = sinusoidal_embedding(position_ids, self.embedding_dim, base=self.base)  # (..., D) float64
        return (self.scale * table).to(self.weight.dtype)


def _plan_nope(model: nn.Module, method: Method, params: Any) -> Plan:
    """NoPE: the rotation (or ``wpe``) removed, nothing else."""
    config_changes, changes, rope_type = positions_removed(model, method, in_attention=False)
    return _replacement_plan(model, method, params, config_changes, changes, rope_type)


def _plan_sinusoidal(model: nn.Module, method: Method, requested: Any) -> Plan:
    """GPT-2's ``wpe`` replaced by :class:`SinusoidalPositions`; ``scale`` defaults to the RMS match of the table."""
    table = position_table(model)
    if table.embedding_dim % 2:
        raise ValueError(f"The sinusoidal table needs an even width; this model's is {table.embedding_dim}.")
    scale = _rms_scale(table) if requested.scale is None else requested.scale
    resolved = dataclasses.replace(requested, scale=scale)
    most = torch.finfo(table.weight.dtype).max
    if resolved.scale > most:
        raise ValueError(
            f"scale={resolved.scale!r} makes the sinusoidal table overflow {table.weight.dtype} (at most {most:.4g}); "
            f"the scale matching the learned table is {_rms_scale(table):.4g}."
        )
    parent_name, _, attribute = _table_path(model, table)
    replace = functools.partial(_replace_table, attribute, resolved.scale, resolved.base)
    changes: list[tuple[nn.Module, ModuleChange]] = [(model.get_submodule(parent_name), replace)]
    return _replacement_plan(model, method, resolved, {"activation_function": replaced_marker(method)}, changes, None)


def _rms_scale(table: nn.Embedding) -> float:
    """The scale giving the sinusoidal table the root-mean-square of the learned ``table`` (1 where it has none)."""
    rms = table.weight.detach().double().pow(2).mean().sqrt().item()
    return rms / SINUSOID_RMS if math.isfinite(rms) and rms > 0 else 1.0


def _table_path(model: nn.Module, table: nn.Module) -> tuple[str, str, str]:
    name = next(name for name, module in model.named_modules() if module is table)
    return name.rpartition(".")


def _replace_table(attribute: str, scale: float, base: float, parent: nn.Module) -> None:
    setattr(parent, attribute, SinusoidalPositions(getattr(parent, attribute), scale, base))


def _replacement_plan(
    model: nn.Module,
    method: Method,
    resolved: Any,
    config_changes: dict[str, Any],
    changes: list[tuple[nn.Module, ModuleChange]],
    rope_type: str | None,
) -> Plan:
    info, updates = replacement_updates(model, method, params_to_dict(resolved), config_changes, rope_type)
    return Plan(info, updates, changes)


PLANS = {"nope": _plan_nope, "sinusoidal": _plan_sinusoidal}


def plan_encoding(model: nn.Module, method: Method, params: Any) -> Plan:
    return PLANS[method.name](model, method, params)


PLANNER = Planner(
    positions=frozenset({"rope", "learned"}), serves=lambda method: method.name in PLANS, plan=plan_encoding
)
