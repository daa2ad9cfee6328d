"""A weak reference to a module that copies of the model it belongs to follow: the patch record's link to its model."""

from __future__ import annotations

import copy
import weakref
from typing import Any

from torch import nn


class ModuleRef:
    """A weak reference to a module of the patched model (the model itself among them) that a deepcopy or a pickle
    of the model turns into one to the copy's own module. Weak, so the model's record of its patch makes no
    reference cycle: a patched model is freed when its last reference goes, as an unpatched one is (its GPU memory
    too), not at the next full garbage collection."""

    __slots__ = ("_ref",)

    def __init__(self, target: nn.Module | None) -> None:
        self._ref = weakref.ref(target) if target is not None else lambda: None

    def __call__(self) -> nn.Module | None:
        return self._ref()

    def __deepcopy__(self, memo: dict[int, Any]) -> ModuleRef:
        target = self._ref()  # copied with the model, its copy is in memo already; else it dies with the copy
        return ModuleRef(copy.deepcopy(target, memo) if target is not None else None)

    def __reduce__(self) -> tuple[type[ModuleRef], tuple[nn.Module | None]]:
        return ModuleRef, (self._ref(),)
