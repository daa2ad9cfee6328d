"""The keys transformers 4.x reads, written beside ``rope_parameters`` so that every reader builds the same model.

transformers 5 keeps a RoPE method in ``config.rope_parameters`` (``rope_theta`` inside) and saves only that;
transformers 4.x (and the serving engines that follow its configs) read ``rope_scaling`` (``type`` in the
oldest releases, ``rope_type`` since) and a top-level ``rope_theta``, and silently build an unscaled model
with ``rope_theta`` 10000 from a file that has only ``rope_parameters``. A patch therefore also writes:

- ``rope_scaling``: ``rope_parameters`` without ``rope_theta`` / ``partial_rotary_factor``, with ``type``
  beside ``rope_type``; ``None`` for the ``default`` type (static NTK says itself through ``rope_theta``).
  hf_posenc's own types go there too, so 4.x refuses them (``KeyError``) rather than loading them unscaled.
- ``rope_theta`` and ``partial_rotary_factor`` at the top level, where 4.x reads them (GPT-NeoX's 4.x class:
  ``rotary_emb_base`` and ``rotary_pct``, :data:`TOP_LEVEL_NAMES`);
- ``original_max_position_embeddings`` at the top level for ``longrope``: 4.x's LongRoPE reads the trained
  context only there (else it takes ``max_position_embeddings``, the extended one, and never switches); and for
  ``llama3``: llama.cpp's converter computes the ``rope_freqs`` factors with L read there only (else 8192).

transformers 5 reads the same file the same way: on loading it takes ``rope_scaling`` as its
``rope_parameters`` and ``rope_theta`` into it (``type`` stays there as an extra key it ignores).

A serving engine's own key for a position method transformers has no key for (vLLM's DCA,
:data:`VLLM_DCA_KEY`) is written by the planner of that method; a base config that ships one (Qwen2.5-1M) gets it
saved as null by any other patch, which the engine would otherwise read as the base's method.

In a transformers 5 config ``rope_scaling`` is a property aliasing ``rope_parameters``; these keys are
written into the instance's ``__dict__`` (:func:`hf_posenc.record.set_config_attribute`), which
``to_dict`` and so ``save_pretrained`` / ``push_to_hub`` write out, without going through the alias.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from ..record import CONFIG_KEY, PatchRecord
from .plan import Plan

_TOP_LEVEL = ("rope_theta", "partial_rotary_factor")
# transformers 4.x config classes that set the top-level keys from keys of their own, ignoring the file's
# ``rope_theta`` / ``partial_rotary_factor``: 4.57's GPTNeoXConfig takes ``rotary_emb_base`` (default 10000) and
# ``rotary_pct`` (default 0.25). transformers 5 reads them only where ``rope_parameters`` lacks the value.
TOP_LEVEL_NAMES: dict[str, dict[str, str]] = {
    "gpt_neox": {"rope_theta": "rotary_emb_base", "partial_rotary_factor": "rotary_pct"},
}
LEGACY_KEYS = (
    "rope_scaling",
    *_TOP_LEVEL,
    "original_max_position_embeddings",
    *(name for names in TOP_LEVEL_NAMES.values() for name in names.values()),
)
VLLM_DCA_KEY = "dual_chunk_attention_config"  # what vLLM reads for Qwen2 (Qwen2.5-1M ships it)
ENGINE_KEYS = (VLLM_DCA_KEY,)
TOP_LEVEL_ORIGINAL_TYPES = ("longrope", "llama3")  # whose L some reader takes from the top level only
_TYPE_AND_FACTOR = {"linear": ("type", "factor"), "dynamic": ("type", "factor")}
# transformers 4.x config classes whose ``_rope_scaling_validation`` takes exactly these ``rope_scaling`` fields (any
# other key is a ValueError): model_type -> rope type -> fields. Not Phi-3's longrope (type, short_factor,
# long_factor): transformers 5 takes a non-empty ``rope_scaling`` as its ``rope_parameters``, and would read those
# three fields back without the factor and attention factor the patch records; its 4.x class refuses the full dict.
FIXED_FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    "olmo": _TYPE_AND_FACTOR,
    "olmo2": _TYPE_AND_FACTOR,
    "olmo3": _TYPE_AND_FACTOR,
}


def legacy_rope_keys(rope_parameters: dict[str, Any], model_type: str | None = None) -> dict[str, Any]:
    """The transformers 4.x keys saying what a flat ``rope_parameters`` says (empty for per-layer-type ones,
    which 4.x has no single key for), in the fields ``model_type``'s 4.x config class takes (:data:`FIXED_FIELDS`)."""
    if not isinstance(rope_parameters, dict) or "rope_type" not in rope_parameters:
        return {}
    rope_type = rope_parameters["rope_type"]
    scaling = {key: value for key, value in rope_parameters.items() if key not in _TOP_LEVEL}
    scaling = _in_fixed_fields({**scaling, "type": rope_type}, FIXED_FIELDS.get(model_type or "", {}).get(rope_type))
    keys: dict[str, Any] = {"rope_scaling": None if rope_type == "default" else scaling}
    keys.update({key: rope_parameters[key] for key in _TOP_LEVEL if key in rope_parameters})
    own_names = TOP_LEVEL_NAMES.get(model_type or "", {})
    keys.update({own_names[key]: keys[key] for key in own_names if key in keys})
    if rope_type in TOP_LEVEL_ORIGINAL_TYPES:
        keys["original_max_position_embeddings"] = rope_parameters["original_max_position_embeddings"]
    return copy.deepcopy(keys)


def _in_fixed_fields(scaling: dict[str, Any], fields: tuple[str, ...] | None) -> dict[str, Any]:
    """``scaling`` cut to ``fields`` (``type`` and ``factor`` say all of linear and dynamic)."""
    return scaling if fields is None else {key: scaling[key] for key in fields}


def with_legacy_keys(config: Any, plan: Plan) -> Plan:
    """``plan`` also writing the 4.x keys of the ``rope_parameters`` it sets, and null for each engine key
    (:data:`ENGINE_KEYS`) the config ships and the plan does not write; their base values (``None``: absent) kept in
    the record so that :meth:`PatchRecord.base_config` puts them back."""
    keys = legacy_rope_keys(plan.updates.get("rope_parameters"), getattr(config, "model_type", None))
    keys.update({key: None for key in ENGINE_KEYS if key not in plan.updates and config.__dict__.get(key) is not None})
    if not keys:
        return plan
    record = PatchRecord.from_config(plan.updates)
    base = {key: copy.deepcopy(config.__dict__.get(key)) for key in keys}
    record = dataclasses.replace(record, base={**base, **record.base})
    return dataclasses.replace(plan, updates={**plan.updates, **keys, CONFIG_KEY: record.to_dict()})
