"""The ``Trainer`` whose optimizer gives the position parameters a patch added their own learning rate.

The optimizer is the one the ``Trainer`` builds (its class from ``optim``, its weight-decay groups), built where
the ``Trainer`` builds it: under FSDP that is after the model is wrapped, and ``Trainer`` refuses an optimizer
passed in ``optimizers`` there. Each of its parameter groups then gives up the position parameters to a group
of its own settings at ``position_learning_rate``; the schedule scales every group alike.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Trainer

# The module names FSDP (version 1, with use_orig_params), activation checkpointing and torch.compile insert in
# parameter names (torch.distributed.fsdp's FSDP_WRAPPED_MODULE, checkpoint_wrapper's _CHECKPOINT_WRAPPED_MODULE,
# OptimizedModule's _orig_mod).
_WRAPPER_NAMES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def unwrapped_name(name: str) -> str:
    """A parameter's name in the model as patched, from its name in a wrapped model."""
    for wrapper in _WRAPPER_NAMES:
        name = name.replace(wrapper, "")
    return name


class PositionRateTrainer(Trainer):
    """``Trainer`` with ``position_learning_rate`` for the parameters named in ``position_parameters`` (the
    ``Trainer`` as it is where the rate is None)."""

    def __init__(
        self, *args: Any, position_parameters: frozenset[str], position_learning_rate: float | None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.position_parameters = position_parameters
        self.position_learning_rate = position_learning_rate

    def create_optimizer(self, model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
        built = self.optimizer is None
        optimizer = super().create_optimizer(model)
        if built and self.position_learning_rate is not None:
            wrapped = self.model if model is None else model
            names = {id(p): unwrapped_name(name) for name, p in wrapped.named_parameters()}
            position = self.position_parameters
            _split_groups(optimizer, lambda p: names.get(id(p)) in position, self.position_learning_rate)
        return optimizer


def _split_groups(optimizer: torch.optim.Optimizer, selected: Any, rate: float) -> None:
    """Move the parameters ``selected`` picks out of each group into a copy of it at ``rate`` (before any step)."""
    moved = []
    for group in list(optimizer.param_groups):
        picked = [p for p in group["params"] if selected(p)]
        if not picked:
            continue
        moved.append({**group, "params": picked, "lr": rate})
        group["params"] = [p for p in group["params"] if not selected(p)]
        if not group["params"]:
            optimizer.param_groups.remove(group)
    if not moved:
        raise RuntimeError(
            "position_learning_rate: none of the parameters the patch added is among the optimizer's (they do not "
            "train, or FSDP without use_orig_params flattened them into one); leave position_learning_rate out, or "
            "train them as they are."
        )
    for group in moved:
        optimizer.add_param_group(group)
