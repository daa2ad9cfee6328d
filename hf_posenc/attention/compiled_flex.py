"""Which compilation of ``flex_attention`` runs a call on CUDA (uncompiled, flex materialises n x n scores).

Compiled for fixed lengths, flex runs faster than compiled for dynamic shapes: about 1.3x in the library's
ALiBi path on an H100 at 16k tokens (0.53x of causal SDPA against 0.41x; ``benchmarks/results/alibi_h100.json``
and ``flex_probe_h100.json``). So a prefill (query length = key length: the long forwards of evaluation and
training) gets a compilation for its shapes, for the first :data:`STATIC_PREFILLS` kinds of call seen. Every
other call (a decoding step, whose key length grows by one each time) and kinds past those run the compilation
for dynamic shapes: one compilation per length would reach dynamo's recompile limit, past which flex runs
uncompiled. Dynamo guards on more than a kind records (a mask function's code, autocast, ...), so the
fixed-shape compilation is ``fullgraph``: at the limit it raises rather than falling back, and the call goes to
the dynamic compilation, as every later one does.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
from torch.nn.attention.flex_attention import flex_attention

logger = logging.getLogger(__name__)

STATIC_PREFILLS = 4
"""How many kinds of prefill call get flex compiled for their exact shapes."""


class StaticPrefills:
    """The kinds of prefill call compiled for their exact shapes so far; closed once dynamo refuses more."""

    def __init__(self) -> None:
        self.kinds: set[tuple] = set()
        self.closed = False

    def admits(self, call: tuple) -> bool:
        if self.closed or (call not in self.kinds and len(self.kinds) >= STATIC_PREFILLS):
            return False
        self.kinds.add(call)
        return True


_STATIC = StaticPrefills()


@functools.cache
def _compiled_flex_attention() -> Any:
    return torch.compile(flex_attention, dynamic=True)


def _static_flex(*args: Any, **kwargs: Any) -> torch.Tensor:
    """``flex_attention`` under a name of its own: dynamo counts recompilations per code object, so the
    compilations for fixed shapes leave the budget of the dynamic one alone."""
    return flex_attention(*args, **kwargs)


@functools.cache
def _compiled_static_flex_attention() -> Any:
    return torch.compile(_static_flex, dynamic=False, fullgraph=True)


def _kind(label: str, query: torch.Tensor, key: torch.Tensor, scale: float) -> tuple:
    """What makes dynamo compile again for fixed shapes, as far as a call shows it."""
    layouts = tuple((tuple(t.shape), t.stride()) for t in (query, key))
    modes = (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), query.requires_grad)
    return (label, layouts, query.dtype, query.device, scale, modes)


def compiled_flex(label: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kwargs: Any):
    """``flex_attention(query, key, value, **kwargs)`` compiled; ``label`` names the caller's kind of score_mod."""
    if query.shape[2] == key.shape[2] and _STATIC.admits(_kind(label, query, key, kwargs.get("scale"))):
        try:
            return _compiled_static_flex_attention()(query, key, value, **kwargs)
        except torch._dynamo.exc.FailOnRecompileLimitHit as error:  # as many lengths as dynamo allows: expected
            _STATIC.closed = True
            logger.info("flex attention compiled for fixed shapes no more (%s); dynamic shapes from here", error)
        except torch._dynamo.exc.TorchDynamoException as error:  # a failed compilation: the runs slow down, say why
            _STATIC.closed = True
            logger.warning(
                "flex attention could not be compiled for fixed shapes (%s); dynamic shapes from here (slower)", error
            )
    return _compiled_flex_attention()(query, key, value, **kwargs)
