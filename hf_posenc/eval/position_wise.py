"""A long window's MLPs and norms run over slices of the sequence, so that their intermediates never exist at once.

A decoder layer's MLP and norms act on each position alone: run over consecutive slices of the sequence, each
slice's output written into one tensor, they give the output of one call. The peak of a long window's forward is then
the weights, the attention and one slice's intermediates, where one call of a gated MLP of width ``I`` holds about
``3 · n · I`` values (at 128k tokens and ``I = 11008`` in bfloat16: 8 GiB). The slices are of equal size, so that
each matrix product runs on as many rows as the others (at least half the slice size, and the size is at least
``MIN_SEQUENCE_SLICE``: a CPU's matrix kernels for a few rows sum in another order).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator

import torch
from torch import nn

from .defaults import MIN_SEQUENCE_SLICE

_WORDS = ("mlp", "norm")  # a layer's child whose class name ends with one of these acts on each position alone


def position_wise_modules(model: nn.Module) -> list[nn.Module]:
    """The MLPs and norms of ``model``'s decoder: each decoder layer's children (those transformers names in
    ``_no_split_modules``) and the decoder's own children whose class name ends with ``MLP`` or ``Norm``
    (``LlamaMLP``, ``LlamaRMSNorm``, ``LayerNorm``), or that are a `torch.nn.LayerNorm`."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [module for module in decoder.modules() if type(module).__name__ in names]
    return [child for parent in [decoder, *layers] for child in parent.children() if _acts_on_positions(child)]


def _acts_on_positions(module: nn.Module) -> bool:
    name = type(module).__name__.lower()
    return isinstance(module, nn.LayerNorm) or name.endswith(_WORDS)


@contextlib.contextmanager
def sequence_slices(model: nn.Module, size: int) -> Iterator[None]:
    """Within the block, :func:`position_wise_modules` of ``model`` run over slices of at most ``size`` positions
    when called on a sequence longer than that; ``size`` 0: unchanged. Where accelerate's hooks wrap a module, its
    inner forward is sliced, so that the hook moves the weights once per call.

    Raises:
        `ValueError`: ``size`` is neither 0 nor a whole number >= ``MIN_SEQUENCE_SLICE``.
    """
    check_sequence_slice(size)
    modules = position_wise_modules(model) if size else []
    saved = [(module, _forward_name(module)) for module in modules]
    saved = [(module, name, module.__dict__.get(name)) for module, name in saved]
    try:
        for module, name, _ in saved:
            setattr(module, name, functools.partial(_sliced, getattr(module, name), size))
        yield
    finally:
        for module, name, previous in saved:
            if previous is None:
                delattr(module, name)
            else:
                setattr(module, name, previous)


def check_sequence_slice(size: object) -> None:
    """Raises `ValueError` unless ``size`` is 0 (one call) or a whole number of positions >= ``MIN_SEQUENCE_SLICE``."""
    if isinstance(size, bool) or not isinstance(size, int) or (size != 0 and size < MIN_SEQUENCE_SLICE):
        raise ValueError(
            f"The sequence slice must be 0 (one call) or a whole number of positions >= {MIN_SEQUENCE_SLICE}, "
            f"got {size!r}."
        )


def _forward_name(module: nn.Module) -> str:
    """The attribute to slice: accelerate's hook calls ``_old_forward`` from the ``forward`` it installs."""
    return "_old_forward" if hasattr(module, "_hf_hook") and "_old_forward" in module.__dict__ else "forward"


def _sliced(forward: Callable, size: int, hidden: torch.Tensor, *args, **kwargs):
    """``forward(hidden, *args, **kwargs)`` over equal slices of dimension 1 of at most ``size`` positions, where
    ``hidden`` is ``(B, T, …)`` with ``T > size``; the tensor arguments of the same ``(B, T)`` are sliced with it. An
    output that is not one ``(B, slice, …)`` tensor (a module that is not position-wise after all) is computed
    again by one call."""
    if not isinstance(hidden, torch.Tensor) or hidden.dim() < 3 or hidden.shape[1] <= size:
        return forward(hidden, *args, **kwargs)
    batch, length = hidden.shape[:2]
    step = math.ceil(length / math.ceil(length / size))
    output = None
    for begin in range(0, length, step):
        part = slice(begin, begin + step)
        cut = [_cut(a, hidden, part) for a in args]
        piece = forward(_cut(hidden, hidden, part), *cut, **{k: _cut(v, hidden, part) for k, v in kwargs.items()})
        if not isinstance(piece, torch.Tensor) or piece.shape[:2] != hidden[:, part].shape[:2]:
            return forward(hidden, *args, **kwargs)
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
