"""Dual Chunk Attention (An et al. 2024, "Training-Free Long-Context Scaling of Large Language Models",
arXiv 2402.17463, §3; HKUNLP/ChunkLlama; vLLM's ``dual_chunk_attention_config``).

Chunk length ``s = chunk_size - local_size``; every key sits at ``j mod s``. A query ``i`` is put at

* ``i mod s`` for keys of its own chunk (intra-chunk: the true relative positions),
* ``min(i mod s + s, chunk_size)`` for keys of the previous chunk (successive-chunk: the first
  ``local_size + 1`` queries of a chunk, ``i mod s <= local_size``, see its predecessor at true distances),
* ``min(2s - 1, chunk_size)`` for keys of every earlier chunk (inter-chunk),

chunks counted by ``floor(position / s)``, with one softmax over all keys. Every relative position stays
at most ``chunk_size``, so any length runs. The defaults for a model trained on ``L`` positions are the
authors' code's for Qwen (``chunkqwen_attn_replace.py``): ``chunk_size = 3L/4`` and ``local_size = L/16``
(their Llama code takes ``L/8``).

This is the paper's DCA, with no temperature. The authors' later code (ChunkLlama after 2024-03, "not used in
the paper") scales q and k by ``0.05 ln(n/L) + 1`` past ``L``, and vLLM's DCA, given
``original_max_position_embeddings`` in its config (as Qwen2.5-1M ships), scales the keys by
``max(1, 0.1 ln(n/L) + 1)``, ``n`` the input's length; neither is applied here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..fields import documented, setting
from ..registry import Method, register
from ._common import positive_int
from .remap import RemapParams, Tiles


@documented
@dataclass(frozen=True, kw_only=True)
class DCAParams(RemapParams):
    """Dual chunk attention: intra-chunk, inter-chunk and successive-chunk positions (An et al. 2024)."""

    SEGMENTS: ClassVar[tuple[str, ...]] = ("intra", "successive", "inter")
    TRUE_DISTANCES: ClassVar[tuple[bool, ...]] = (True, False, False)
    KEY_SEGMENTS: ClassVar[tuple[int, ...]] = (0, 1, 1)  # K(j) = j mod s outside the intra-chunk segment

    chunk_size: int | None = setting(
        None,
        help="the largest relative position used, at most ``L`` (``L`` itself, as Qwen2.5-1M ships, puts the farthest "
        "keys one position past the trained ``0 .. L-1``); defaults to ``3L/4``, or to the config's "
        "``dual_chunk_attention_config`` where it has one.",
    )
    local_size: int | None = setting(
        None,
        help="below ``chunk_size``; chunks are ``chunk_size - local_size`` long. Defaults to ``L/16``, or to the "
        "config's ``dual_chunk_attention_config`` where it has one.",
    )
    max_position_embeddings: int | None = setting(
        None,
        help="the longest input the patched model is meant to serve, at least ``L``, written to the config (what vLLM "
        "and lm-evaluation-harness take as the model's length). DCA itself has no longest input; by default the "
        "config's value is kept.",
    )

    def __post_init__(self) -> None:
        """Checks the sizes; ``defaulted`` (not a field) names those not given, which ``L`` sets (3L/4, L/16) and a
        config's ``dual_chunk_attention_config`` may set instead."""
        super().__post_init__()
        for name in ("chunk_size", "local_size", "max_position_embeddings"):
            if getattr(self, name) is not None:
                self._set(name, positive_int(name, getattr(self, name)))
        context = self.original_max_position_embeddings
        self._set("defaulted", tuple(name for name in ("chunk_size", "local_size") if getattr(self, name) is None))
        if context is not None:
            if self.chunk_size is None:
                self._set("chunk_size", 3 * context // 4)
            if self.local_size is None:
                self._set("local_size", max(1, context // 16))
            if self.max_position_embeddings is not None and self.max_position_embeddings < context:
                raise ValueError(
                    f"max_position_embeddings (the longest input to serve) must be at least the trained context "
                    f"L={context}, got {self.max_position_embeddings}."
                )
            if self.chunk_size > context:
                raise ValueError(
                    f"chunk_size must be at most the trained context L={context} (it is the largest relative position "
                    f"DCA uses), got {self.chunk_size}."
                )
        if self.chunk_size is not None and self.local_size is not None and self.local_size >= self.chunk_size:
            raise ValueError(
                f"local_size must be below chunk_size={self.chunk_size} (chunks are chunk_size - local_size long), "
                f"got local_size={self.local_size} (the default is L/16)."
            )

    @property
    def chunk_length(self) -> int:
        """``s = chunk_size - local_size``."""
        return self.chunk_size - self.local_size

    def segment_of(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        s = self.chunk_length
        apart = torch.div(i, s, rounding_mode="floor") - torch.div(j, s, rounding_mode="floor")
        return apart.clamp(0, 2)

    def query_position(self, segment: int, i: torch.Tensor) -> torch.Tensor:
        s = self.chunk_length
        if segment == 0:
            return torch.remainder(i, s)
        if segment == 1:
            return (torch.remainder(i, s) + s).clamp(max=self.chunk_size)
        return torch.full_like(i, min(2 * s - 1, self.chunk_size))

    def key_position(self, segment: int, j: torch.Tensor) -> torch.Tensor:
        return torch.remainder(j, self.chunk_length)

    def key_span(self, segment: int, first: int, last: int) -> tuple[int, int]:
        s = self.chunk_length
        if segment == 0:
            return first // s * s, last
        if segment == 1:
            return (first // s - 1) * s, last // s * s - 1
        return 0, (last // s - 1) * s - 1

    def tiles(self, segment: int, length: int) -> list[Tiles]:
        """In chunks of ``s`` queries: intra-chunk, the causal square of each chunk; successive-chunk, each chunk
        against the whole chunk before it; inter-chunk, each chunk against every key before the chunk before it
        (one tile per chunk: their key ranges differ). A last partial chunk takes its rows of each."""
        s = self.chunk_length
        chunks, rest = divmod(length, s)
        if segment == 0:
            tiles = [Tiles("lower", 0, 0, s, s, chunks)] if chunks else []
            return tiles + ([Tiles("lower", chunks * s, chunks * s, rest, rest)] if rest else [])
        if segment == 1:
            tiles = [Tiles("full", s, 0, s, s, chunks - 1)] if chunks > 1 else []
            return tiles + ([Tiles("full", chunks * s, (chunks - 1) * s, rest, s)] if rest and chunks else [])
        return [Tiles("full", start, 0, min(s, length - start), start - s) for start in range(2 * s, length, s)]


register(
    Method(
        name="dca",
        aliases=("dual-chunk-attention", "chunkllama"),
        params=DCAParams,
        role="remap",
        depends_on_length=False,
        paper="An et al. 2024, Training-Free Long-Context Scaling of Large Language Models (arXiv 2402.17463)",
        summary="Training-free: chunked positions, every relative position at most chunk_size; any length runs.",
    )
)
