"""What serving engines build from a saved ``config.json``, against what transformers 5 builds from it.

:data:`ENGINES` holds what each engine's source says (release or commit in ``version``, files in ``doc``): where
it reads the RoPE method, and per rope type a rule: built as transformers 5 does (``ok``), otherwise (``differs``,
both values computed), unscaled (``ignored``) or not at all (``refused``). :func:`engine_findings` applies it.

transformers 5 takes ``rope_scaling`` when non-empty, else ``rope_parameters``; ``rope_theta`` from that dict, else
the top level (10000 when absent); a top-level ``original_max_position_embeddings`` wins for yarn / llama3 /
longrope (5.23 ``convert_rope_params_to_dict``, ``standardize_rope_params``). vLLM and SGLang load configs with
transformers 5; TGI and transformers 4.x read ``rope_scaling`` and the top-level ``rope_theta`` only; llama.cpp's
converter reads ``rope_parameters`` first.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from .rules import (
    SAME,
    Rule,
    Setting,
    View,
    attention_sglang,
    attention_tgi,
    dynamic_sglang,
    dynamic_tgi,
    dynamic_vllm,
    ignored,
    linear_longer,
    llama3_llamacpp,
    longrope_llamacpp,
    longrope_table,
    longrope_tgi,
    needs_dict_original,
    same,
    yarn_attention_hf,
    yarn_by_family,
    yarn_llamacpp,
    yarn_rule,
)

logger = logging.getLogger("hf_posenc")

SEVERITIES = ("ok", "differs", "refused", "ignored")
REFERENCE_READS = ("rope_scaling", "rope_parameters")  # transformers 5: rope_scaling when non-empty
_NOT_PARAMS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
_LEGACY_PAIRS = {("su", "longrope"), ("mrope", "default")}  # type / rope_type pairs vLLM lets through
_ALIASES = dict(_LEGACY_PAIRS)  # old names every reader takes as the new one (Phi-3's "su", Qwen2-VL's "mrope")


@dataclass(frozen=True)
class Finding:
    """One line of the verdict: ``engine`` builds the config ``severity`` (one of :data:`SEVERITIES`)."""

    engine: str
    severity: str
    message: str
    release: str = ""  # the engine's release (or commit) whose source its rule was read from


@dataclass(frozen=True)
class Engine:
    """One engine: ``release``: the release (or commit) its rules were read from, as ``check`` prints it;
    ``version`` / ``doc``: what was read, in full; ``reads``: keys holding the method, first non-empty wins;
    ``theta_from_rope``: ``rope_theta`` from that dict before the top level; ``builds``: rope type -> rule;
    ``unknown`` / ``activation``: severity for another rope type / hf_posenc's GPT-2 ``activation_function``;
    ``dual_chunk``: model types whose ``dual_chunk_attention_config`` it reads first (``dual_chunk_gap``: why it
    cannot run it all the same); ``strict_type``: ``type`` and ``rope_type`` that disagree are an error;
    ``added_tensors``: why it refuses weights holding tensors a patch added (empty: no such refusal known);
    ``needs``: model type -> top-level keys it indexes for that family (a KeyError without them); ``plain_rope``:
    model types it builds with RoPE base 10000 unscaled whatever the config says (its converter writes neither)."""

    name: str
    release: str
    version: str
    doc: str
    reads: tuple[str, ...]
    theta_from_rope: bool
    builds: dict[str, Rule]
    unknown: str
    activation: str
    dual_chunk: tuple[str, ...] = ()
    dual_chunk_gap: str = ""
    strict_type: bool = False
    added_tensors: str = ""
    needs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    plain_rope: tuple[str, ...] = ()


ENGINES = (
    Engine(
        name="vllm",
        release="vllm 0.34.0",
        version="vllm 0.34.0 (PyPI wheel; transformers>=5.16.1,<5.23)",
        doc="model_executor/layers/rotary_embedding/{__init__ (get_rope), yarn_scaling_rope, dynamic_ntk_scaling_rope, "
        "phi3_long_rope_scaled_rope}.py, transformers_utils/config.py (patch_legacy_rope_type), config/model.py "
        "(_get_and_verify_max_len), models/deepseek_v2.py. YaRN reads attention_factor, mscale, mscale_all_dim, betas, "
        "truncate (DeepSeek-V2/V3: deepseek_yarn, the mscale pair only).",
        reads=REFERENCE_READS,
        theta_from_rope=True,
        builds={
            **SAME,
            "linear": linear_longer,
            "dynamic": dynamic_vllm,
            "yarn": yarn_by_family(yarn_attention_hf),
            "longrope": longrope_table(
                "long factors at every position when --max-model-len > {L}, else short ones only (default {L})"
            ),
        },
        unknown="refused",
        activation="refused",
        dual_chunk=("qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next"),
        dual_chunk_gap="no attention backend takes it (V0's dual_chunk_flash_attn.py is gone; FlashAttentionImpl has "
        "no such argument)",
        strict_type=True,
    ),
    Engine(
        name="sglang",
        release="sglang 0.5.23",
        version="sglang 0.5.23 (PyPI wheel; transformers==5.19.0)",
        doc="srt/layers/rotary_embedding/{factory (get_rope), yarn, rope_variant}.py, srt/models/{llama,qwen2}.py, "
        "srt/utils/hf_transformers/common.py (get_context_length). YaRN reads attn_factor, mscale, mscale_all_dim, "
        "betas, truncate; not attention_factor (DeepSeek-V2/V3: deepseek_yarn, defaults 1 and 0).",
        reads=REFERENCE_READS,
        theta_from_rope=True,
        builds={
            **SAME,
            "linear": linear_longer,
            "dynamic": dynamic_sglang,
            "yarn": yarn_by_family(attention_sglang),
            "longrope": longrope_table(
                "long factors for the whole batch once a position passes {L}; its long table and default context "
                "are max_position_embeddings = {P}"
            ),
        },
        unknown="refused",
        activation="ignored",
        dual_chunk=("qwen2", "qwen2_moe", "qwen3_moe", "glm4"),
        dual_chunk_gap="no attention backend takes its five-part query: 0.5.23 registers no dual_chunk_flash_attn "
        "backend (attention_registry.py; not in arg_groups/choices.py's ATTENTION_BACKEND_CHOICES: removed, RFC "
        "sgl-project/sglang#32112)",
    ),
    Engine(
        name="llama.cpp",
        release="llama.cpp 0c1e57098",
        version="ggml-org/llama.cpp@0c1e57098 (in llama-cpp-python 0.3.36; converter pins transformers 4.57.6)",
        doc="conversion/{base (TextModel.__init__, set_gguf_parameters), llama (llama3 rope_freqs), phi}.py, "
        "src/llama-model.cpp, src/llama-context.cpp (YaRN attention factor), src/models/llama.cpp, ggml/src/ggml.c "
        "(ggml_rope_yarn_corr_dims). Reads rope_parameters before rope_scaling.",
        reads=("rope_parameters", "rope_scaling"),
        theta_from_rope=True,
        builds={
            **SAME,
            "llama3": llama3_llamacpp,
            "dynamic": ignored("no dynamic NTK in Llama / Qwen GGUFs (the converter leaves 'dynamic' to HunYuan)"),
            # llama-context.cpp overwrites the GGUF's yarn_attn_factor (read by Grok only) with YaRN's own
            "yarn": yarn_llamacpp,
            "longrope": longrope_llamacpp,
        },
        unknown="ignored",
        activation="ignored",
        added_tensors="its converter has no GGUF name for the tensors the patch added (the T5 bias table): refuses "
        "to convert the weights",
        needs={"gpt2": ("n_ctx",)},  # conversion/gpt2.py; transformers 5 saves no n_ctx for GPT-2
        # conversion/{gemma,gptneox,stablelm}.py and phi.py's Phi2Model: set_gguf_parameters without super() writes no
        # rope.freq_base or rope.scaling keys (run on saved configs: only context_length and rope.dimension_count)
        plain_rope=("gemma", "gemma2", "gpt_neox", "phi", "stablelm"),
    ),
    Engine(
        name="tgi",
        release="tgi db931fcf",
        version="huggingface/text-generation-inference@db931fcf (v3.3.7 and a CI-only commit; transformers 4.x)",
        doc="server/text_generation_server/layers/rotary.py (PositionRotaryEmbedding.static), "
        "models/custom_modeling/flash_llama_modeling.py, models/flash_causal_lm.py (warmup), launcher/src/main.rs.",
        reads=("rope_scaling",),
        theta_from_rope=False,
        builds={
            **SAME,
            "linear": ignored("linear: static() sets no scaling factor for it"),
            "dynamic": dynamic_tgi,
            "yarn": needs_dict_original(yarn_rule(attention_tgi, betas=False, truncate=False, hf_l=False), "yarn"),
            "llama3": needs_dict_original(same, "llama3"),
            "longrope": longrope_tgi,
        },
        unknown="refused",
        activation="refused",
    ),
)


def rope_view(config: dict[str, Any], reads: tuple[str, ...], theta_from_rope: bool = True) -> View:
    """The method as a reader taking it from the first non-empty key of ``reads`` sees it (per layer type: the
    ``full_attention`` entry, as llama.cpp takes it)."""
    found = ((key, config[key]) for key in reads if isinstance(config.get(key), dict) and config[key])
    source, rope = next(found, ("none", {}))
    rope = rope["full_attention"] if isinstance(rope.get("full_attention"), dict) else rope
    theta = rope.get("rope_theta", config.get("rope_theta")) if theta_from_rope else config.get("rope_theta")
    params = {key: value for key, value in rope.items() if key not in _NOT_PARAMS}
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    return View(_ALIASES.get(rope_type, rope_type), params, float(theta or 10000.0), source)


# Engine features that look like a method but are not it: method -> (engine, what a user comparing them must know).
LOOKALIKES: dict[str, tuple[tuple[str, str], ...]] = {
    "self-extend": (
        (
            "llama.cpp",
            "its group attention (--grp-attn-n G, --grp-attn-w W) is not this Self-Extend: it divides the positions of "
            "whole batches of cached keys at once instead of keeping the last W keys at true positions, and its cells' "
            "pos_div records the shift with the opposite sign of pos_add's (src/llama-kv-cells.h), so divided keys are "
            "rotated the wrong way; its numbers are not Self-Extend's",
        ),
    ),
    "string": (
        (
            "vllm",
            "the authors' vLLM fork (HKUNLP/STRING, vllm_string) reads a string_config {shifted_offset, local_value}; "
            "released vLLM has no such key",
        ),
    ),
}


def lookalike_notes(method: str) -> list[tuple[str, str]]:
    """``(engine, note)`` for each part of ``method`` (a registered name or combination) that an engine has a
    lookalike of (:data:`LOOKALIKES`)."""
    return [note for part in method.split("+") for note in LOOKALIKES.get(part, ())]


def config_rotary_dim(config: dict[str, Any], view: View) -> int | None:
    """``head_dim`` (else ``hidden_size / num_attention_heads``) times ``partial_rotary_factor``; None if unknown."""
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    head_dim = config.get("head_dim") or (hidden // heads if heads and hidden else None)
    fraction = view.params.get("partial_rotary_factor", config.get("partial_rotary_factor") or 1.0)
    return None if head_dim is None else int(head_dim * fraction)


def engine_findings(config: dict[str, Any], *, added_tensors: bool = False) -> list[Finding]:
    """Per engine of :data:`ENGINES`, whether it builds ``config`` (a ``config.json`` dict) as transformers 5 does,
    with weights that hold tensors the patch added where ``added_tensors`` (a T5 table); first a ``config`` finding
    for keys other readers take otherwise. Raises TypeError if ``config`` is no dict."""
    if not isinstance(config, dict):
        raise TypeError(f"A config is a JSON object, got a {type(config).__name__}.")
    reference = rope_view(config, REFERENCE_READS)
    gap = _config_gaps(config, reference)
    findings = [
        Finding(engine.name, "refused", engine.added_tensors, engine.release)
        if added_tensors and engine.added_tensors
        else Finding(engine.name, *_verdict(engine, config, reference), engine.release)
        for engine in ENGINES
    ]
    return findings if gap is None else [Finding("config", *gap), *findings]


def _config_gaps(config: dict[str, Any], reference: View) -> tuple[str, str] | None:
    scaling, parameters = (rope_view(config, (key,)) for key in ("rope_scaling", "rope_parameters"))
    legacy = rope_view(config, ("rope_scaling",), theta_from_rope=False)
    both = "none" not in (scaling.source, parameters.source)
    first = "transformers 4 and 5, vLLM, SGLang and TGI build rope_scaling's, llama.cpp's converter rope_parameters'"
    if both and (scaling.rope_type, scaling.params) != (parameters.rope_type, parameters.params):
        kinds = f"{scaling.rope_type} / {parameters.rope_type}"
        return "differs", f"rope_scaling and rope_parameters disagree ({kinds}): {first}"
    if legacy.source == "none" and reference.rope_type != "default":
        readers = "readers of rope_scaling (transformers 4.x, TGI) build plain RoPE"
        return "ignored", f"only rope_parameters says {reference.rope_type}: {readers}"
    if legacy.theta != reference.theta:
        theta = f"top-level rope_theta {legacy.theta:g} (10000 when absent), rope dict {reference.theta:g}"
        return "differs", f"{theta}: transformers 4.x and TGI use the top-level one"
    return None


def _verdict(engine: Engine, config: dict[str, Any], reference: View) -> tuple[str, str]:
    activation, dual_chunk = config.get("activation_function"), config.get("dual_chunk_attention_config")
    missing = [key for key in engine.needs.get(config.get("model_type"), ()) if key not in config]
    if missing:
        return "refused", f"its {config['model_type']} converter reads {missing[0]} (KeyError: not in this config)"
    if isinstance(activation, str) and activation.startswith("hf_posenc"):
        if engine.activation == "refused":
            return "refused", f"activation_function {activation!r} is unknown to it: refuses the model"
        return "ignored", f"does not read activation_function {activation!r}: builds the model without the change"
    if isinstance(dual_chunk, dict) and config.get("model_type") in engine.dual_chunk:
        sizes = ", ".join(f"{key} {dual_chunk.get(key)}" for key in ("chunk_size", "local_size"))
        return "refused", f"builds dual chunk RoPE ({sizes}), but {engine.dual_chunk_gap}"
    if reference.source == "none" and "rope_theta" not in config:
        return "ok", "no RoPE keys in the config: nothing position-specific for it to read"
    raw = config.get(reference.source) or {}
    clash = raw.get("type"), raw.get("rope_type")
    if engine.strict_type and None not in clash and clash[0] != clash[1] and clash not in _LEGACY_PAIRS:
        return "refused", f"{reference.source} has type {clash[0]!r} and rope_type {clash[1]!r}: ValueError on loading"
    view = rope_view(config, engine.reads, engine.theta_from_rope)
    if (view.rope_type, view.params, view.theta) != (reference.rope_type, reference.params, reference.theta):
        return _misread(view, reference)
    model_type = config.get("model_type")
    if model_type in engine.plain_rope and (view.rope_type != "default" or view.theta != 10000.0):
        return "ignored", (
            f"its {model_type} converter writes no RoPE base or scaling: plain RoPE with rope_theta 10000, not "
            f"{view.rope_type} with rope_theta {view.theta:g}"
        )
    rule = engine.builds.get(view.rope_type)
    if rule is None and engine.unknown == "refused":
        return "refused", f"rope type {view.rope_type!r} is unknown to it: refuses to build the model"
    if rule is None:
        return "ignored", f"rope type {view.rope_type!r} is unknown to it: plain RoPE (rope_theta {view.theta:g})"
    return rule(
        Setting(config, view, int(config.get("max_position_embeddings") or 2048), config_rotary_dim(config, view))
    )


def _misread(view: View, reference: View) -> tuple[str, str]:
    where, want = view.source.replace("none", "no rope_scaling"), f"transformers 5 reads {reference.source}"
    if view.rope_type == "default" and not view.params and reference.rope_type != "default":
        return "ignored", f"reads {where}: plain RoPE (rope_theta {view.theta:g}); {want}: {reference.rope_type}"
    if (view.rope_type, view.params) == (reference.rope_type, reference.params):
        return "differs", f"rope_theta {view.theta:g} (from {where} or the top level); {want}: {reference.theta:g}"
    return "differs", f"reads {view.rope_type} from {where}; {want}: {reference.rope_type}"
