"""A long window's MLPs and norms run over slices of the sequence, so that their intermediates never exist at once.

A decoder layer's MLP and norms act on each position alone: run over consecutive slices of the sequence, each
slice's output written into one tensor, they give the output of one call. The peak of a long window's forward is then
the weights, the attention and one slice's intermediates, where one call of a gated MLP of width ``I`` holds about
``3 · n · I`` values (at 128k tokens and ``I = 11008`` in bfloat16: 8 GiB). The slices differ in size by one row at
most, so that each matrix product runs on as many rows as the others (more than half the slice size, and the size is
at least ``MIN_SEQUENCE_SLICE``: a CPU's matrix kernels for a few rows sum in another order).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from .defaults import check_sequence_slice

logger = logging.getLogger("hf_posenc")
_SUFFIXES = ("mlp", "rmsnorm", "layernorm")  # class names of a layer's children that act on each position alone


def position_wise_modules(model: nn.Module) -> list[nn.Module]:
    """The MLPs and norms of ``model``'s decoder, each once: each decoder layer's children (the layers are the modules
    transformers names in ``_no_split_modules``) and the decoder's own children whose class name ends with ``MLP``,
    ``RMSNorm`` or ``LayerNorm`` (``LlamaMLP``, ``LlamaRMSNorm``), or that are a `torch.nn.LayerNorm`; not those
    whose weights accelerate moves in from an offload (its hooks below them would move the weights once a slice)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [module for module in decoder.modules() if type(module).__name__ in names]
    found = {id(c): c for parent in [decoder, *layers] for c in parent.children() if _acts_on_positions(c)}
    return [module for module in found.values() if not _hooked_below(module)]


def _acts_on_positions(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm) or type(module).__name__.lower().endswith(_SUFFIXES)


def _hooked_below(module: nn.Module) -> bool:
    return any(hasattr(child, "_hf_hook") for child in module.modules() if child is not module)


@contextlib.contextmanager
def sequence_slices(model: nn.Module, size: int) -> Iterator[None]:
    """Within the block, :func:`position_wise_modules` of ``model`` run over slices of at most ``size`` positions
    when called on a sequence longer than that; ``size`` 0: unchanged. Where accelerate's hook wraps a module itself,
    its inner forward is sliced, so that the hook runs once per call.

    Raises:
        `ValueError`: ``size`` is neither 0 nor a whole number >= ``MIN_SEQUENCE_SLICE``.
    """
    check_sequence_slice(size)
    modules = position_wise_modules(model) if size else []
    saved = [(module, _forward_name(module)) for module in modules]
    saved = [(module, name, module.__dict__.get(name)) for module, name in saved]
    try:
        for module, name, _ in saved:
            setattr(module, name, _Sliced(getattr(module, name), size, type(module).__name__))
        yield
    finally:
        for module, name, previous in saved:
            if previous is None:
                module.__dict__.pop(name, None)
            else:
                setattr(module, name, previous)


def _forward_name(module: nn.Module) -> str:
    """The attribute to slice: accelerate's hook calls ``_old_forward`` from the ``forward`` it installs."""
    return "_old_forward" if hasattr(module, "_hf_hook") and "_old_forward" in module.__dict__ else "forward"


class _Sliced:
    """``forward`` over slices of dimension 1 of its input. A module whose output is not one ``(B, slice, …)`` tensor
    (not position-wise after all: a mixture of experts returning its router's logits too) is called whole, that
    call and every later one, and said once."""

    def __init__(self, forward: Callable, size: int, name: str) -> None:
        self.forward, self.size, self.name, self.whole = forward, size, name, False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        hidden = args[0] if args else next((v for v in kwargs.values() if isinstance(v, torch.Tensor)), None)
        if self.whole or not isinstance(hidden, torch.Tensor) or hidden.dim() < 3 or hidden.shape[1] <= self.size:
            return self.forward(*args, **kwargs)
        batch, length = hidden.shape[:2]
        count = math.ceil(length / self.size)
        bounds = [length * i // count for i in range(count + 1)]  # sizes differ by one at most
        output = None
        for begin, end in itertools.pairwise(bounds):
            part = slice(begin, end)
            piece = self.forward(
                *(_cut(a, hidden, part) for a in args), **{k: _cut(v, hidden, part) for k, v in kwargs.items()}
            )
            if not isinstance(piece, torch.Tensor) or piece.shape[:2] != (batch, end - begin):
                self.whole = True
                logger.info(
                    "hf_posenc: %s does not return one tensor per position; it runs on whole sequences.", self.name
                )
                return self.forward(*args, **kwargs)
            if output is None:
                output = piece.new_empty((batch, length, *piece.shape[2:]))
            output[:, part] = piece
        return output


def _cut(value: object, hidden: torch.Tensor, part: slice) -> object:
    """``value[:, part]`` (contiguous: a module may ``view`` it) where ``value`` is a tensor of ``hidden``'s batch and
    sequence length, else ``value``."""
    if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[:2] == hidden.shape[:2]:
        return value[:, part].contiguous()
    return value
