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

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SEVERITIES = ("ok", "differs", "refused", "ignored")
REFERENCE_READS = ("rope_scaling", "rope_parameters")  # transformers 5: rope_scaling when non-empty
_NOT_PARAMS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
_BETAS = {"beta_fast": 32.0, "beta_slow": 1.0}  # YaRN's defaults, fixed where an engine does not read them
_LEGACY_PAIRS = {("su", "longrope"), ("mrope", "default")}  # type / rope_type pairs vLLM lets through
_ALIASES = dict(_LEGACY_PAIRS)  # old names every reader takes as the new one (Phi-3's "su", Qwen2-VL's "mrope")


@dataclass(frozen=True)
class Finding:
    """One line of the verdict: ``engine`` builds the config ``severity`` (one of :data:`SEVERITIES`)."""

    engine: str
    severity: str
    message: str


@dataclass(frozen=True)
class View:
    """The RoPE method as one reader takes it: type, parameters, ``rope_theta`` and the key it came from."""

    rope_type: str
    params: dict[str, Any]
    theta: float
    source: str  # "rope_scaling", "rope_parameters" or "none"


@dataclass(frozen=True)
class Setting:
    """What a rule reads: the config, the engine's view (equal to transformers'), P and the rotary dimension d."""

    config: dict[str, Any]
    view: View
    positions: int
    dim: int | None

    @property
    def factor(self) -> float:  # transformers' yarn: P / L when the config has no factor
        return float(self.view.params.get("factor") or self.positions / self.original())

    def original(self, top_level_first: bool = True) -> int:
        """L: top level first, as transformers 5 takes it, or the dict's first (llama.cpp)."""
        key = "original_max_position_embeddings"
        top, own = self.config.get(key), self.view.params.get(key)
        return int(((top or own) if top_level_first else (own or top)) or self.positions)


Rule = Callable[[Setting], tuple[str, str]]
Attention = Callable[[dict[str, Any], float], float]


@dataclass(frozen=True)
class Engine:
    """One engine: ``version`` / ``doc``: what was read; ``reads``: keys holding the method, first non-empty wins;
    ``theta_from_rope``: ``rope_theta`` from that dict before the top level; ``builds``: rope type -> rule;
    ``unknown`` / ``activation``: severity for another rope type / hf_posenc's GPT-2 ``activation_function``;
    ``dual_chunk``: model types whose ``dual_chunk_attention_config`` it reads first (``dual_chunk_gap``: why it
    cannot run it all the same); ``strict_type``: ``type`` and ``rope_type`` that disagree are an error."""

    name: str
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


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's ``0.1 * mscale * ln(s) + 1`` (1 for ``s <= 1``), as every engine writes it."""
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def yarn_attention_hf(params: dict[str, Any], factor: float) -> float:
    """transformers 5 and vLLM 0.33: ``attention_factor``, else the mscale ratio if both are truthy, else YaRN's."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    mscale, all_dims = params.get("mscale"), params.get("mscale_all_dim")
    return yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dims) if mscale and all_dims else yarn_mscale(factor)


def _attention_sglang(params: dict[str, Any], factor: float) -> float:
    """SGLang: the mscale ratio if both are given (not None), else YaRN's; times ``attn_factor`` (1)."""
    mscale, all_dims = params.get("mscale"), params.get("mscale_all_dim")
    ratio = yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dims) if None not in (mscale, all_dims) else None
    return (ratio or yarn_mscale(factor)) * float(params.get("attn_factor", 1.0))


def _attention_tgi(params: dict[str, Any], factor: float) -> float:
    """TGI: ``mscale`` (default 1) over ``mscale_all_dim`` (default 0, which gives 1)."""
    return yarn_mscale(factor, params.get("mscale", 1.0)) / yarn_mscale(factor, params.get("mscale_all_dim", 0.0))


def same(setting: Setting) -> tuple[str, str]:
    """Built as transformers 5 builds it."""
    return "ok", f"builds {setting.view.rope_type} (rope_theta {setting.view.theta:g}) as transformers does"


def _linear_longer(setting: Setting) -> tuple[str, str]:
    """The same frequencies; the default context is ``max_position_embeddings * factor``."""
    s, p = setting.factor, setting.positions
    return "ok", f"builds linear x{s:g} as transformers does; default context P x factor = {p} x {s:g} = {p * s:g}"


def _ignored(what: str) -> Rule:
    return lambda setting: ("ignored", f"{what}: builds plain RoPE (rope_theta {setting.view.theta:g})")


def ntk_base(setting: Setting, ratio: float) -> float:
    """Dynamic NTK's ``b (s * ratio - (s - 1))^(d / (d - 2))``, ``ratio`` = length / trained length (nan: no d)."""
    exponent = math.nan if setting.dim is None else setting.dim / (setting.dim - 2)
    return setting.view.theta * (setting.factor * ratio - (setting.factor - 1)) ** exponent


def _dynamic_vllm(setting: Setting) -> tuple[str, str]:
    p, trained = setting.positions, int(setting.view.params.get("max_trained_positions", setting.positions))
    scaled, unscaled = round(p * setting.factor), " (unscaled: no max_trained_positions)" if trained == p else ""
    return "differs", (
        f"one rope_theta {ntk_base(setting, p / trained):.6g} at every length{unscaled}, not recomputed per length "
        f"(transformers: {setting.view.theta:g} up to {p} tokens, {ntk_base(setting, scaled / p):.6g} at {scaled}); "
        f"its cos/sin table holds {p} positions, its default max_model_len is {scaled}"
    )


def _dynamic_sglang(setting: Setting) -> tuple[str, str]:
    p, scaled = setting.positions, round(setting.positions * setting.factor)
    return "differs", (
        f"one rope_theta {ntk_base(setting, scaled / p):.6g} = b (s^2 - s + 1)^(d/(d-2)) at every length, "
        f"transformers' value at {scaled} tokens (transformers: {setting.view.theta:g} up to {p})"
    )


def _dynamic_tgi(setting: Setting) -> tuple[str, str]:
    p, scaled = setting.positions, round(setting.positions * setting.factor)
    return "differs", (
        "rebuilt only for a batch longer than any before, never shrunk, first at the CUDA-graph warm-up length "
        f"--max-total-tokens (default <= P = {p}: unscaled); after {scaled} tokens every later request gets "
        f"rope_theta {ntk_base(setting, scaled / p):.6g} (transformers recomputes per call)"
    )


def _yarn(attention: Attention, *, betas: bool, truncate: bool, hf_l: bool) -> Rule:
    """YaRN in an engine computing its attention factor with ``attention``; reading the betas and ``truncate`` or
    fixing them (32 / 1, floor and ceil); taking L as transformers does (``hf_l``) or from the dict first."""

    def rule(setting: Setting) -> tuple[str, str]:
        params, factor, length = setting.view.params, setting.factor, setting.original(top_level_first=hf_l)
        hf, own = yarn_attention_hf(params, factor), attention(params, factor)
        gaps = [f"attention factor {own:.4f} where transformers uses {hf:.4f}"] if not math.isclose(hf, own) else []
        if length != setting.original():
            gaps.append(f"L = {length} where transformers uses {setting.original()}")
        if not betas and any(float(params.get(key, value)) != value for key, value in _BETAS.items()):
            gaps.append(f"betas fixed at 32/1 (config: {params.get('beta_fast')}/{params.get('beta_slow')})")
        if not truncate and params.get("truncate", True) is False:
            gaps.append("always floors/ceils the ramp (config: truncate false)")
        if gaps:
            return "differs", f"YaRN s={factor:g}: " + "; ".join(gaps)
        return "ok", f"builds YaRN s={factor:g}, L={length}, attention factor {own:.4f} as transformers does"

    return rule


def longrope_attention_hf(setting: Setting) -> float:
    """transformers: ``attention_factor``, else ``sqrt(1 + ln f / ln L)``, f = P / L when L is at the top level."""
    params, top = setting.view.params, setting.config.get("original_max_position_embeddings")
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    factor = setting.positions / top if top else float(params.get("factor", 1.0))
    return math.sqrt(1 + math.log(factor) / math.log(setting.original())) if factor > 1 else 1.0


def longrope_attention_engines(positions: int, length: int) -> float:
    """vLLM, SGLang, TGI: ``sqrt(1 + ln(P / L) / ln L)`` from max_position_embeddings P (1 when P <= L)."""
    return math.sqrt(1 + math.log(positions / length) / math.log(length)) if positions > length else 1.0


def _longrope_table(switch: str) -> Rule:
    """vLLM / SGLang: the attention factor from P / L (``short_mscale`` / ``long_mscale`` where given), never
    ``attention_factor``; the long factors switched on as ``switch`` says."""

    def rule(setting: Setting) -> tuple[str, str]:
        length, p, params = setting.original(), setting.positions, setting.view.params
        derived = longrope_attention_engines(p, length)
        short, long = (float(params.get(key, derived)) for key in ("short_mscale", "long_mscale"))
        scales = f"{short:.4f}" if short == long else f"{short:.4f} (short) / {long:.4f} (long)"
        return "differs", (
            f"attention factor {scales} from max_position_embeddings / L = {p}/{length} (transformers: "
            f"{longrope_attention_hf(setting):.4f}); {switch.format(L=length, P=p)}; transformers uses the short "
            f"factors up to {length} tokens and the long ones for a longer sequence"
        )

    return rule


def _longrope_tgi(setting: Setting) -> tuple[str, str]:
    length, params = setting.config.get("original_max_position_embeddings"), setting.view.params
    if length is None:
        return "refused", "reads original_max_position_embeddings at the top level only, and there is none"
    derived = longrope_attention_engines(setting.positions, int(length))
    scale = f"attention factor {derived:.4f} from max_position_embeddings / L = {setting.positions}/{length}"
    if "short_mscale" in params and "long_mscale" in params:
        scale = "multiplies the rotation angles (not cos/sin) by short_mscale / long_mscale"
    return "differs", (
        f"{scale} (transformers: {longrope_attention_hf(setting):.4f}); short factors for positions below {length} "
        "and long ones past it within one sequence (transformers: one set per sequence)"
    )


_SAME = dict.fromkeys(("default", "linear", "llama3"), same)
# Model types whose llama.cpp converter class writes llama3's per-pair factors (``rope_freqs``: conversion/llama.py
# ``LlamaModel.generate_extra_tensors``, registered for Llama, Mistral and Mixtral); others convert it unscaled.
LLAMA3_FACTORS_IN_GGUF = ("llama", "mistral", "mixtral")


def _llama3_llamacpp(setting: Setting) -> tuple[str, str]:
    model_type = setting.config.get("model_type")
    if model_type in LLAMA3_FACTORS_IN_GGUF:
        return same(setting)
    why = f"llama3: the converter writes its rope_freqs factors for Llama / Mistral only, not {model_type!r}"
    return _ignored(why)(setting)


ENGINES = (
    Engine(
        name="vllm",
        version="vllm 0.33.0 (PyPI wheel; transformers>=5.16.1,<5.21)",
        doc="model_executor/layers/rotary_embedding/{__init__ (get_rope), yarn_scaling_rope, dynamic_ntk_scaling_rope, "
        "phi3_long_rope_scaled_rope}.py, transformers_utils/config.py (patch_legacy_rope_type), config/model.py "
        "(_get_and_verify_max_len). YaRN reads attention_factor, mscale, mscale_all_dim, betas, truncate.",
        reads=REFERENCE_READS,
        theta_from_rope=True,
        builds={
            **_SAME,
            "linear": _linear_longer,
            "dynamic": _dynamic_vllm,
            "yarn": _yarn(yarn_attention_hf, betas=True, truncate=True, hf_l=True),
            "longrope": _longrope_table(
                "long factors at every position when --max-model-len > {L}, else short ones only (default {L})"
            ),
        },
        unknown="refused",
        activation="refused",
        dual_chunk=("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"),
        dual_chunk_gap="no attention backend takes it (V0's dual_chunk_flash_attn.py is gone; FlashAttentionImpl has "
        "no such argument)",
        strict_type=True,
    ),
    Engine(
        name="sglang",
        version="sglang 0.5.23 (PyPI wheel; transformers==5.19.0)",
        doc="srt/layers/rotary_embedding/{factory (get_rope), yarn, rope_variant}.py, srt/models/{llama,qwen2}.py, "
        "srt/utils/hf_transformers/common.py (get_context_length). YaRN reads attn_factor, mscale, mscale_all_dim, "
        "betas, truncate; not attention_factor.",
        reads=REFERENCE_READS,
        theta_from_rope=True,
        builds={
            **_SAME,
            "linear": _linear_longer,
            "dynamic": _dynamic_sglang,
            "yarn": _yarn(_attention_sglang, betas=True, truncate=True, hf_l=True),
            "longrope": _longrope_table(
                "long factors for the whole batch once a position passes {L}; its long table and default context "
                "are max_position_embeddings = {P}"
            ),
        },
        unknown="refused",
        activation="ignored",
        dual_chunk=("qwen2", "qwen2_moe", "qwen3_moe", "glm4"),
        dual_chunk_gap="no attention backend takes it (layers/attention/dual_chunk_flashattention_backend.py is gone)",
    ),
    Engine(
        name="llama.cpp",
        version="ggml-org/llama.cpp@0c1e57098 (in llama-cpp-python 0.3.36; converter pins transformers 4.57.6)",
        doc="conversion/{base (TextModel.__init__, set_gguf_parameters), llama (llama3 rope_freqs), phi}.py, "
        "src/llama-model.cpp, src/llama-context.cpp (YaRN attention factor), src/models/llama.cpp, ggml/src/ggml.c "
        "(ggml_rope_yarn_corr_dims). Reads rope_parameters before rope_scaling.",
        reads=("rope_parameters", "rope_scaling"),
        theta_from_rope=True,
        builds={
            **_SAME,
            "llama3": _llama3_llamacpp,
            "dynamic": _ignored("no dynamic NTK in Llama / Qwen GGUFs (the converter leaves 'dynamic' to HunYuan)"),
            # llama-context.cpp overwrites the GGUF's yarn_attn_factor (read by Grok only) with YaRN's own
            "yarn": _yarn(lambda params, factor: yarn_mscale(factor), betas=False, truncate=False, hf_l=False),
            "longrope": _ignored("no LongRoPE factor tensors outside Phi-3 (conversion/phi.py), attention factor 1"),
        },
        unknown="ignored",
        activation="ignored",
    ),
    Engine(
        name="tgi",
        version="huggingface/text-generation-inference@db931fcf (2026-01-08; transformers 4.x)",
        doc="server/text_generation_server/layers/rotary.py (PositionRotaryEmbedding.static), "
        "models/custom_modeling/flash_llama_modeling.py, models/flash_causal_lm.py (warmup), launcher/src/main.rs.",
        reads=("rope_scaling",),
        theta_from_rope=False,
        builds={
            **_SAME,
            "linear": _ignored("linear: static() sets no scaling factor for it"),
            "dynamic": _dynamic_tgi,
            "yarn": _yarn(_attention_tgi, betas=False, truncate=False, hf_l=False),
            "longrope": _longrope_tgi,
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


def _rotary_dim(config: dict[str, Any], view: View) -> int | None:
    """``head_dim`` (else ``hidden_size / num_attention_heads``) times ``partial_rotary_factor``; None if unknown."""
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    head_dim = config.get("head_dim") or (hidden // heads if heads and hidden else None)
    fraction = view.params.get("partial_rotary_factor", config.get("partial_rotary_factor") or 1.0)
    return None if head_dim is None else int(head_dim * fraction)


def engine_findings(config: dict[str, Any]) -> list[Finding]:
    """Per engine of :data:`ENGINES`, whether it builds ``config`` (a ``config.json`` dict) as transformers 5 does;
    first a ``config`` finding for keys other readers take otherwise. Raises TypeError if ``config`` is no dict."""
    if not isinstance(config, dict):
        raise TypeError(f"A config is a JSON object, got a {type(config).__name__}.")
    reference = rope_view(config, REFERENCE_READS)
    gap = _config_gaps(config, reference)
    findings = [Finding(engine.name, *_verdict(engine, config, reference)) for engine in ENGINES]
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
    rule = engine.builds.get(view.rope_type)
    if rule is None and engine.unknown == "refused":
        return "refused", f"rope type {view.rope_type!r} is unknown to it: refuses to build the model"
    if rule is None:
        return "ignored", f"rope type {view.rope_type!r} is unknown to it: plain RoPE (rope_theta {view.theta:g})"
    return rule(Setting(config, view, int(config.get("max_position_embeddings") or 2048), _rotary_dim(config, view)))


def _misread(view: View, reference: View) -> tuple[str, str]:
    where, want = view.source.replace("none", "no rope_scaling"), f"transformers 5 reads {reference.source}"
    if view.rope_type == "default" and not view.params and reference.rope_type != "default":
        return "ignored", f"reads {where}: plain RoPE (rope_theta {view.theta:g}); {want}: {reference.rope_type}"
    if (view.rope_type, view.params) == (reference.rope_type, reference.params):
        return "differs", f"rope_theta {view.theta:g} (from {where} or the top level); {want}: {reference.theta:g}"
    return "differs", f"reads {view.rope_type} from {where}; {want}: {reference.rope_type}"
