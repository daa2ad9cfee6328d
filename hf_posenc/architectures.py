"""What hf_posenc knows about a model: where its position encoding lives, as data plus small lookups.

Any transformers decoder whose RoPE comes from a rotary-embedding module built from the config (an
``inv_freq`` buffer, a ``rope_type`` and the model's ``config``) is found by the same generic lookup;
the table names how each known ``model_type`` encodes position, for the planners and for clear errors.
The planners (:mod:`hf_posenc.patching`) share these lookups and nothing else.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .registry import Method, methods_for

logger = logging.getLogger("hf_posenc")


@dataclass(frozen=True)
class Positions:
    """How a model family encodes position.

    Attributes:
        kind (`str`): ``"rope"``, ``"learned"`` (an absolute table) or ``"alibi"`` (already a bias).
        where (`str`): the module holding it (a path for learned tables), for errors and lookups.
        supported (`bool`): whether hf_posenc's methods for that kind patch this family (learned tables:
            GPT-2 only).
    """

    kind: str
    where: str = ""
    supported: bool = True


ROPE = Positions("rope", "rotary-embedding module")
ARCHITECTURES: dict[str, Positions] = {
    # RoPE decoders shown in the test suite on tiny random models (and Llama on SmolLM2-135M).
    "llama": ROPE,
    "mistral": ROPE,
    "qwen2": ROPE,
    "qwen3": ROPE,
    # Learned absolute positions and models that already use ALiBi: RoPE methods do not apply.
    "gpt2": Positions("learned", "transformer.wpe"),
    "gpt_bigcode": Positions("learned", "transformer.wpe", supported=False),
    "gpt_neo": Positions("learned", "transformer.wpe", supported=False),
    "opt": Positions("learned", "model.decoder.embed_positions", supported=False),
    "bloom": Positions("alibi", "attention bias"),
    "mpt": Positions("alibi", "attention bias"),
}
# RoPE families whose attention goes through transformers' attention interface with nothing beyond q.k (no
# logit soft-capping, no attention sinks), checked against the eager reference in the test suite: methods
# that change attention itself apply to these (and to GPT-2). Others with a rotary module (Falcon's own
# attention, Gemma 2's softcap, GPT-OSS's sinks) would silently be wrong.
PLAIN_ATTENTION_ROPE_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# transformers' rope types whose frequencies do not depend on the input's length ("dynamic" types and
# "longrope" recompute them from it).
STATIC_ROPE_TYPES = frozenset({"default", "linear", "yarn", "llama3"})
KIND_NAMES = {"rope": "rotary embeddings (RoPE)", "learned": "a learned absolute position table"}


# A family whose config switches its attention to ALiBi (Falcon's ``alibi: true``, falcon-rw-1b/7b): its rotary
# module is still built, but the attention never uses it, so a RoPE method there would change nothing.
ALIBI_SWITCH = Positions("alibi", "the config's alibi: true")


def positions_of(model: nn.Module) -> Positions:
    """How ``model`` encodes position: the config's ALiBi switch, the table, then a look for rotary modules."""
    config = getattr(model, "config", None)
    if getattr(config, "alibi", False) is True:
        return ALIBI_SWITCH
    model_type = getattr(config, "model_type", None)
    if model_type in ARCHITECTURES:
        return ARCHITECTURES[model_type]
    return ROPE if rotary_modules(model) else Positions("unknown")


def positions_of_config(config: Any) -> Positions:
    """How a model built from ``config`` encodes position, before it is built: the ALiBi switch, the table, else
    RoPE (the only kind hf_posenc patches in families it does not list)."""
    if getattr(config, "alibi", False) is True:
        return ALIBI_SWITCH
    return ARCHITECTURES.get(getattr(config, "model_type", None), ROPE)


def trained_context(config: Any, given: int | None = None) -> int:
    """``L``: ``given`` (a method's ``original_max_position_embeddings``), else recorded by the config
    (``original_max_position_embeddings`` in ``rope_parameters``, at the top level, or in the
    ``dual_chunk_attention_config`` vLLM reads, as Qwen2.5-1M ships it), else guessed from
    ``max_position_embeddings`` with a note at INFO (``hf-posenc`` commands show it once per run)."""
    if given is not None:
        configured = getattr(config, "max_position_embeddings", None)
        if isinstance(given, int) and isinstance(configured, int) and given > configured:
            logger.warning(
                "hf_posenc: original_max_position_embeddings=%d is above the config's max_position_embeddings=%d: "
                "L is the context the model was trained at, which its config does not exceed. Check the value.",
                given,
                configured,
            )
        return given
    dual_chunk = getattr(config, "dual_chunk_attention_config", None)
    recorded = (
        config.rope_parameters.get("original_max_position_embeddings")
        or getattr(config, "original_max_position_embeddings", None)
        or (dual_chunk.get("original_max_position_embeddings") if isinstance(dual_chunk, dict) else None)
    )
    if recorded:
        return recorded
    context = config.max_position_embeddings
    logger.info(
        "hf_posenc: original_max_position_embeddings not given; using the config's max_position_embeddings "
        "= %d as the trained context L. Pass original_max_position_embeddings=... if that is not right.",
        context,
    )
    return context


def served_context(config: Any, given: int | None = None) -> int:
    """``L`` for the attention-level methods (Self-Extend, DCA, log-n): :func:`trained_context`, except on a base
    that already ships a RoPE scaling (Llama 3.1's ``llama3``, Phi-3's ``longrope``), where it is the config's
    ``max_position_embeddings`` when that is longer: the context such a model is served at. A patch then never
    lowers the context the model advertises, and log-n leaves every position it serves as it was.
    ``given`` still wins."""
    context = trained_context(config, given)
    rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if given is not None or rope_type == "default":
        return context
    return max(context, config.max_position_embeddings)


def depends_on_length(model: nn.Module) -> bool:
    """Whether the unpatched ``model``'s output at a position may depend on the input's total length, not only
    on the tokens up to it. `False` only where known: GPT-2 and the plain-attention RoPE families of the table
    with a static rope type (on all rotary modules); `True` for everything else (a dynamic or LongRoPE base,
    MPT, whose ALiBi bias is offset by the length, families not in the table)."""
    model_type = getattr(model.config, "model_type", None)
    if model_type == "gpt2":
        return False
    if model_type not in PLAIN_ATTENTION_ROPE_MODEL_TYPES:
        return True
    rope = getattr(model.config, "rope_parameters", None) or {}
    types = {rope.get("rope_type")} | {module.rope_type for _, module in rotary_modules(model)}
    return not types <= STATIC_ROPE_TYPES


def rotary_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The rotary-embedding modules of ``model`` (named), found by what they hold, not by class."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if "inv_freq" in getattr(module, "_buffers", {}) and hasattr(module, "rope_type") and hasattr(module, "config")
    ]


def rotary_dim(config: Any) -> int:
    """``head_dim * partial_rotary_factor``: the number of dimensions RoPE rotates."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return int(head_dim * config.rope_parameters.get("partial_rotary_factor", 1.0))


def rope_modules(model: nn.Module, *, scaled_ok: bool = False, bases_differ_ok: bool = False) -> list[nn.Module]:
    """The rotary modules of a model with one set of RoPE parameters, or ``ValueError``.

    Args:
        scaled_ok (`bool`): accept a model whose RoPE is already scaled (``rope_type`` other than
            ``default``); otherwise only plain RoPE, the base a scaling method starts from.
        bases_differ_ok (`bool`): accept rotary modules built with different frequencies (GraniteSWA's
            per-layer bases), for a method that removes the rotation and so writes no frequencies.
    """
    named = rotary_modules(model)
    modules = [module for _, module in named]
    rope = getattr(model.config, "rope_parameters", None) or {}
    if "rope_type" not in rope:
        raise ValueError(
            f"{type(model).__name__} has per-layer RoPE parameters ({sorted(rope)}); hf_posenc patches "
            "models with one set of RoPE parameters."
        )
    if rope["rope_type"] != "default" and not scaled_ok:
        raise ValueError(
            f"{type(model).__name__} already uses rope_type {rope['rope_type']!r}; hf_posenc patches models "
            "trained with plain RoPE (rope_type 'default'). Load the base model instead."
        )
    pairs = rotary_dim(model.config) // 2
    for module in modules:
        if module.inv_freq.numel() != pairs:
            raise ValueError(
                f"{type(module).__name__} holds {module.inv_freq.numel()} frequencies but the config implies "
                f"{pairs}; this architecture is not supported."
            )
    first_name, first = named[0] if named else ("", None)
    for name, module in named[1:]:  # GraniteSWA's layer_rope_theta: one rotary module per base
        if not bases_differ_ok and not _rotate_alike(module, first):
            raise ValueError(
                f"{type(model).__name__}'s rotary modules hold different frequencies ({name} is not {first_name}: "
                "per-layer RoPE bases); hf_posenc patches models with one set of RoPE parameters."
            )
    return modules


def _rotate_alike(one: nn.Module, other: nn.Module) -> bool:
    """Whether two rotary modules were built with the same frequencies (transformers' dynamic update keeps them as
    ``original_inv_freq``); on the meta device, which holds no values (a config-only push), whether their configs
    give the same base."""
    built = [getattr(module, "original_inv_freq", module.inv_freq) for module in (one, other)]
    if any(frequencies.is_meta for frequencies in built):
        return _base(one) == _base(other)
    return torch.equal(built[0].float().cpu(), built[1].float().cpu())


def _base(module: nn.Module) -> Any:
    return (getattr(module.config, "rope_parameters", None) or {}).get("rope_theta")


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The self-attention modules (those dispatching through the attention interface), one per layer."""
    modules = [
        module
        for module in model.modules()
        if getattr(module, "is_causal", False) and hasattr(module, "layer_idx") and hasattr(module, "config")
    ]
    if len(modules) != model.config.num_hidden_layers:
        raise ValueError(
            f"Found {len(modules)} attention modules in {type(model).__name__} for "
            f"{model.config.num_hidden_layers} layers; this architecture's attention cannot be patched."
        )
    return modules


def position_table(model: nn.Module) -> nn.Embedding:
    """GPT-2's ``wpe``; other learned-position families raise (their attention is not dispatched alike)."""
    model_type = model.config.model_type
    if model_type != "gpt2":
        raise ValueError(
            f"hf_posenc patches learned positions of GPT-2 only (model_type 'gpt2'); this model is {model_type!r}."
        )
    if getattr(model.config, "add_cross_attention", False):
        raise ValueError("GPT-2 with cross-attention (add_cross_attention=True) is not supported.")
    root = getattr(model, "base_model", model)
    return root.get_submodule(positions_of(model).where.removeprefix(f"{root.base_model_prefix}."))


def unsupported(model: nn.Module, method: Method, positions: Positions) -> ValueError:
    """The error for ``method`` on a model whose positions it cannot patch; names what does apply."""
    model_type = getattr(getattr(model, "config", None), "model_type", "?")
    if positions.kind == "unknown":
        return ValueError(
            f"{type(model).__name__} (model_type {model_type!r}) has no rotary-embedding module hf_posenc can "
            f"patch (one with an `inv_freq` buffer, a `rope_type` and the config; per-layer-type RoPE such as "
            f"Gemma 3's is not supported yet), so method {method.name!r} does not apply. hf_posenc patches rotary "
            "embeddings, and GPT-2's learned position table."
        )
    applicable = methods_for(positions.kind) if positions.supported else []
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
