"""Which planner serves a method on a model: the one table of planners."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..architectures import positions_of, positions_of_config, unsupported
from ..registry import Method
from .attention import PLANNER as ATTENTION_LEVEL
from .learned import PLANNER as LEARNED_TABLE
from .plan import Planner
from .rope import PLANNER as ROPE_SCALING

PLANNERS: tuple[Planner, ...] = (ROPE_SCALING, ATTENTION_LEVEL, LEARNED_TABLE)


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
    patching the built model then says why)."""
    return _serving(positions_of_config(config).kind, method)
