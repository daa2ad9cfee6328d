"""Where a model keeps its position encoding: data, plus one generic lookup for rotary modules.

Any transformers decoder whose RoPE comes from a rotary-embedding module built from the config
(an ``inv_freq`` buffer, a ``rope_type`` and the model's ``config``) is patched by the same code;
the table only names how each known ``model_type`` encodes position, for clear errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from .registry import Method, methods_for


@dataclass(frozen=True)
class Positions:
    """How a model family encodes position: ``"rope"``, ``"learned"`` (absolute table) or ``"alibi"``;
    ``patched``: whether the methods for that kind apply to this family (learned tables: GPT-2 only)."""

    kind: str
    where: str = ""
    patched: bool = True


ROPE = Positions("rope", "rotary-embedding module")
ARCHITECTURES: dict[str, Positions] = {
    # RoPE decoders shown in the test suite on tiny random models (and Llama on SmolLM2-135M).
    "llama": ROPE,
    "mistral": ROPE,
    "qwen2": ROPE,
    "qwen3": ROPE,
    # Learned absolute positions and models that already use ALiBi: RoPE methods do not apply.
    "gpt2": Positions("learned", "transformer.wpe"),
    "gpt_bigcode": Positions("learned", "transformer.wpe", patched=False),
    "gpt_neo": Positions("learned", "transformer.wpe", patched=False),
    "opt": Positions("learned", "model.decoder.embed_positions", patched=False),
    "bloom": Positions("alibi", "attention bias"),
    "mpt": Positions("alibi", "attention bias"),
}


def rotary_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The rotary-embedding modules of ``model`` (named), found by what they hold, not by class."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if "inv_freq" in getattr(module, "_buffers", {}) and hasattr(module, "rope_type") and hasattr(module, "config")
    ]


def positions_of(model: nn.Module) -> Positions:
    """How ``model`` encodes position: the table first, then a look for rotary modules."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in ARCHITECTURES:
        return ARCHITECTURES[model_type]
    return ROPE if rotary_modules(model) else Positions("unknown")


KIND_NAMES = {"rope": "rotary embeddings (RoPE)", "learned": "a learned absolute position table"}


def unsupported(model: nn.Module, method: Method, positions: Positions) -> ValueError:
    """The error for ``method`` on a model whose positions it cannot patch; names what does apply."""
    model_type = getattr(getattr(model, "config", None), "model_type", "?")
    if positions.kind == "unknown":
        return ValueError(
            f"{type(model).__name__} (model_type {model_type!r}) has no rotary-embedding module hf_posenc can "
            f"patch (one with an `inv_freq` buffer, a `rope_type` and the config; per-layer-type RoPE such as "
            f"Gemma 3's is not supported yet), so method {method.name!r} does not apply."
        )
    applicable = methods_for(positions.kind) if positions.patched else []
    alternatives = (
        f"Methods for {positions.kind} positions: {', '.join(applicable)}."
        if applicable
        else f"No registered method patches {positions.kind} positions of {model_type!r} models yet."
    )
    where = f" ({positions.where})" if positions.where else ""
    needs = " or ".join(KIND_NAMES.get(kind, kind) for kind in sorted(method.applies_to, reverse=True))
    return ValueError(
        f"{type(model).__name__} (model_type {model_type!r}) encodes position as {positions.kind}{where}; "
        f"method {method.name!r} needs {needs}. {alternatives}"
    )


def rotary_dim(config: Any) -> int:
    """``head_dim * partial_rotary_factor``: the number of dimensions RoPE rotates."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return int(head_dim * config.rope_parameters.get("partial_rotary_factor", 1.0))
