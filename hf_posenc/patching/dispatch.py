"""Which planner serves a method on a model: the one table of planners, and combinations of methods."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..architectures import positions_of, positions_of_config, trained_context, unsupported
from ..record import CONFIG_KEY, PatchRecord
from ..registry import Method, combine, with_context
from .attention_level import PLANNER as EXTENSION
from .bias import ALIBI_PLANNER, T5_PLANNER
from .encodings import PLANNER as ENCODINGS
from .learned import PLANNER as LEARNED_TABLE
from .legacy import ENGINE_KEYS, with_legacy_keys
from .plan import PatchInfo, Plan, Planner
from .rope import PLANNER as ROPE_SCALING

PLANNERS: tuple[Planner, ...] = (ROPE_SCALING, ALIBI_PLANNER, T5_PLANNER, ENCODINGS, EXTENSION, LEARNED_TABLE)


def _serving(kind: str, method: Method) -> Planner | None:
    if kind not in method.applies_to:
        return None
    return next((p for p in PLANNERS if kind in p.positions and p.serves(method)), None)


def planner_for(model: nn.Module, method: Method) -> Planner:
    """The planner of ``method`` on ``model``; ``ValueError`` naming what applies when none serves it."""
    positions = positions_of(model)
    planner = _serving(positions.kind, method)
    if planner is None:
        raise unsupported(model, method, positions)
    return planner


def planner_for_config(config: Any, method: Method) -> Planner | None:
    """The planner of ``method`` on a model built from ``config``, before it is built (None: none serves it;
    patching the built model then says why). For a combination with a RoPE scaling, the rest's planner: the one
    whose loading needs apply (a remap's backend)."""
    rope = method.part("rope")
    if method.parts and rope is not None:
        method = _without(method, rope)
    return _serving(positions_of_config(config).kind, method)


def _without(method: Method, part: Method) -> Method:
    """A combination without ``part``: the one method left, or the combination of those left."""
    rest = [other for other in method.parts if other is not part]
    return rest[0] if len(rest) == 1 else combine(*rest)


def plan_method(model: nn.Module, method: Method, params: Any) -> Plan:
    """The plan of ``method`` on ``model`` (``params``: its parameters, built), with the keys other readers read
    beside ``rope_parameters`` (:mod:`~hf_posenc.patching.legacy`). A combination with a RoPE scaling
    (``"yarn+logn"``) is planned by the RoPE planner for that part and by the extension planner for the rest, each on
    its own parameters (the trained context, resolved once, goes to both), and the two plans become one."""
    return with_legacy_keys(model.config, _plan(model, method, params))


def _plan(model: nn.Module, method: Method, params: Any) -> Plan:
    rope = method.part("rope")
    if not method.parts or rope is None:
        return planner_for(model, method).plan(model, method, params)
    others = _without(method, rope)
    planners = [planner_for(model, part) for part in (rope, others)]  # an architecture neither serves: its error
    resolved = with_context(params, trained_context(model.config, params.original_max_position_embeddings))
    plans = [
        planner.plan(model, part, _part_params(method, resolved, part))
        for part, planner in zip((rope, others), planners, strict=True)
    ]
    return _merged(model.config, method, plans)


def _part_params(method: Method, params: Any, part: Method) -> Any:
    """The parameters of ``part`` (a method of the combination ``method``, or a combination of some of its methods)
    within ``params``, the combination's, built."""
    by_name = dict(zip((each.name for each in method.parts), params.part_params, strict=True))
    if part.name in by_name:
        return by_name[part.name]
    return part.params(**{name: getattr(params, name) for name in part.param_names})


def _merged(config: Any, method: Method, plans: list[Plan]) -> Plan:
    """One plan doing what ``plans`` do, in order. A dict attribute both change (``rope_parameters``) gets the
    later plan's changed entries over the earlier plan's value; one record names the combination, with every
    part's parameters and the base value of every attribute any part changes. An engine's key one part writes
    (:data:`~hf_posenc.patching.legacy.ENGINE_KEYS`) is left out: that engine would read the part alone."""
    updates: dict[str, Any] = {}
    for plan in plans:
        for key, value in plan.updates.items():
            if key == CONFIG_KEY or key in ENGINE_KEYS:
                continue
            before = getattr(config, key, None)
            if isinstance(value, dict) and isinstance(updates.get(key), dict) and isinstance(before, dict):
                value = {**updates[key], **{k: v for k, v in value.items() if before.get(k) != v}}
            updates[key] = value
    records = [PatchRecord.from_config(plan.updates) for plan in plans]
    base = {key: value for record in reversed(records) for key, value in record.base.items() if key in updates}
    params = {key: value for record in records for key, value in record.params.items()}
    updates = {**updates, CONFIG_KEY: PatchRecord(method.name, params, False, base).to_dict()}
    info = PatchInfo(
        method.name,
        {key: value for plan in plans for key, value in plan.info.params.items()},
        native=False,
        rope_type=updates["rope_parameters"]["rope_type"],
    )
    reports = [plan.report for plan in plans if plan.report is not None]
    attention = [plan.attention for plan in plans if plan.attention is not None]
    changes = [change for plan in plans for change in plan.changes]
    return Plan(info, updates, changes, reports[-1] if reports else None, attention[-1] if attention else None)
