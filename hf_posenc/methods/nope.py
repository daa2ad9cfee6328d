"""NoPE (Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length Generalization in Transformers",
arXiv 2305.19466): no position encoding at all. A causal decoder can still infer position from its mask.

On a RoPE decoder every rotation becomes the identity (``cos = 1``, ``sin = 0``); on GPT-2 the learned table
contributes nothing. A model trained with positions needs fine-tuning to work without them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..registry import Method, register


@dataclass(frozen=True, kw_only=True)
class NopeParams:
    """NoPE has no parameters."""


register(
    Method(
        name="nope",
        params=NopeParams,
        applies_to=frozenset({"rope", "learned"}),
        role="replace",
        depends_on_length=False,
        paper="Kazemnejad et al. 2023, The Impact of Positional Encoding on Length Generalization in Transformers "
        "(arXiv 2305.19466)",
        summary="Removes the position encoding (RoPE's rotation or GPT-2's table); needs fine-tuning.",
    )
)
