"""How each serving engine builds a RoPE type, as its source says: the rules (pure functions of a :class:`Setting`,
each giving a severity and a message) and the formulas they share. :mod:`hf_posenc.serving.engines` holds the table of
engines that uses them and applies it to a config."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BETAS = {"beta_fast": 32.0, "beta_slow": 1.0}  # YaRN's defaults, fixed where an engine does not read them
# Config classes (transformers 4.x and 5) with a top-level ``original_max_position_embeddings`` default, which their
# loading copies into the rope dict over the file's value: model_type -> default.
CLASS_ORIGINAL = {"phi3": 4096, "phi4_multimodal": 4096}
# Families whose attention reads YaRN's mscale pair besides the rotation: every engine's DeepSeek-V2 code (llama.cpp's
# src/models/deepseek2.cpp and conversion/deepseek.py, vLLM's and SGLang's models/deepseek_v2.py).
DEEPSEEK_V2_FAMILY = ("deepseek_v2", "deepseek_v3")


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

    @property
    def top_original(self) -> int | None:
        """The top-level ``original_max_position_embeddings`` a config class reads: the file's, else the class's
        default where it has one (Phi-3's 4096). llama.cpp's converter loads through ``AutoConfig`` too."""
        return self.config.get("original_max_position_embeddings") or CLASS_ORIGINAL.get(self.config.get("model_type"))

    @property
    def llamacpp_original(self) -> int | None:
        """L as llama.cpp's converter takes it: the rope dict's, else the top-level one, which it mirrors into the
        dict (conversion/base.py ``TextModel.__init__``); None without either."""
        return self.view.params.get("original_max_position_embeddings") or self.top_original

    def original(self, top_level_first: bool = True) -> int:
        """L: top level first, as transformers 5 takes it, or the dict's first (:attr:`llamacpp_original`); else P."""
        own = self.view.params.get("original_max_position_embeddings")
        return int(((self.top_original or own) if top_level_first else self.llamacpp_original) or self.positions)


Rule = Callable[[Setting], tuple[str, str]]
Attention = Callable[[dict[str, Any], float], float]


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's ``0.1 * mscale * ln(s) + 1`` (1 for ``s <= 1``), as every engine writes it."""
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def yarn_attention_hf(params: dict[str, Any], factor: float) -> float:
    """transformers 5 and vLLM 0.33: ``attention_factor``, else the mscale ratio if both are truthy, else YaRN's."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    mscale, all_dims = params.get("mscale"), params.get("mscale_all_dim")
    return yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dims) if mscale and all_dims else yarn_mscale(factor)


def attention_sglang(params: dict[str, Any], factor: float) -> float:
    """SGLang: the mscale ratio if both are given (not None), else YaRN's; times ``attn_factor`` (1)."""
    mscale, all_dims = params.get("mscale"), params.get("mscale_all_dim")
    ratio = yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dims) if None not in (mscale, all_dims) else None
    return (ratio or yarn_mscale(factor)) * float(params.get("attn_factor", 1.0))


def attention_llamacpp(model_type: str | None) -> Attention:
    """llama.cpp: YaRN's ``0.1 ln s + 1`` (src/llama-context.cpp overwrites the GGUF's attention factor with it).
    DeepSeek-V2/V3 GGUFs carry ``mscale_all_dim`` (``rope.scaling.yarn_log_multiplier``): there the rotation gets
    1 (llama-context.cpp takes ``mscale = mscale_all_dim``, a ratio of 1) and the graph multiplies the softmax scale
    by ``(0.1 mscale_all_dim ln s + 1)^2``, as transformers' DeepseekV2 does; only the rotation is compared here."""
    if model_type in DEEPSEEK_V2_FAMILY:
        return lambda params, factor: 1.0 if params.get("mscale_all_dim") else yarn_mscale(factor)
    return lambda params, factor: yarn_mscale(factor)


def attention_tgi(params: dict[str, Any], factor: float) -> float:
    """TGI: ``mscale`` (default 1) over ``mscale_all_dim`` (default 0, which gives 1)."""
    return yarn_mscale(factor, params.get("mscale", 1.0)) / yarn_mscale(factor, params.get("mscale_all_dim", 0.0))


def same(setting: Setting) -> tuple[str, str]:
    """Built as transformers 5 builds it."""
    return "ok", f"builds {setting.view.rope_type} (rope_theta {setting.view.theta:g}) as transformers does"


def linear_longer(setting: Setting) -> tuple[str, str]:
    """The same frequencies; the default context is ``max_position_embeddings * factor``."""
    s, p = setting.factor, setting.positions
    return "ok", f"builds linear x{s:g} as transformers does; default context P x factor = {p} x {s:g} = {p * s:g}"


def ignored(what: str) -> Rule:
    return lambda setting: ("ignored", f"{what}: builds plain RoPE (rope_theta {setting.view.theta:g})")


def ntk_base(setting: Setting, ratio: float) -> float:
    """Dynamic NTK's ``b (s * ratio - (s - 1))^(d / (d - 2))``, ``ratio`` = length / trained length (nan: no d)."""
    exponent = math.nan if setting.dim is None else setting.dim / (setting.dim - 2)
    return setting.view.theta * (setting.factor * ratio - (setting.factor - 1)) ** exponent


def dynamic_vllm(setting: Setting) -> tuple[str, str]:
    p, trained = setting.positions, int(setting.view.params.get("max_trained_positions", setting.positions))
    scaled, unscaled = round(p * setting.factor), " (unscaled: no max_trained_positions)" if trained == p else ""
    return "differs", (
        f"one rope_theta {ntk_base(setting, p / trained):.6g} at every length{unscaled}, not recomputed per length "
        f"(transformers: {setting.view.theta:g} up to {p} tokens, {ntk_base(setting, scaled / p):.6g} at {scaled}); "
        f"its cos/sin table holds {p} positions, its default max_model_len is {scaled}"
    )


def dynamic_sglang(setting: Setting) -> tuple[str, str]:
    p, scaled = setting.positions, round(setting.positions * setting.factor)
    return "differs", (
        f"one rope_theta {ntk_base(setting, scaled / p):.6g} = b (s^2 - s + 1)^(d/(d-2)) at every length, "
        f"transformers' value at {scaled} tokens (transformers: {setting.view.theta:g} up to {p})"
    )


def dynamic_tgi(setting: Setting) -> tuple[str, str]:
    p, scaled = setting.positions, round(setting.positions * setting.factor)
    return "differs", (
        "rebuilt only for a batch longer than any before, never shrunk, first at the CUDA-graph warm-up length "
        f"--max-total-tokens (default <= P = {p}: unscaled); after {scaled} tokens every later request gets "
        f"rope_theta {ntk_base(setting, scaled / p):.6g} (transformers recomputes per call)"
    )


def yarn_llamacpp(setting: Setting) -> tuple[str, str]:
    """YaRN in llama.cpp: the attention factor of :func:`attention_llamacpp` for the model type, betas fixed,
    always floor/ceil; L indexed in the rope dict, the top-level one mirrored there (``set_gguf_parameters``: a
    KeyError without either)."""
    if setting.llamacpp_original is None:
        why = "reads original_max_position_embeddings from the rope dict or the top level, and there is none"
        return "refused", f"yarn: its converter {why} (KeyError)"
    attention = attention_llamacpp(setting.config.get("model_type"))
    return yarn_rule(attention, betas=False, truncate=False, hf_l=False)(setting)


def yarn_by_family(attention: Attention) -> Rule:
    """YaRN in vLLM or SGLang: ``attention``'s factor, but on DeepSeek-V2/V3 that of the ``deepseek_yarn`` rotation
    their DeepSeek code builds instead (models/deepseek_v2.py): the mscale ratio with defaults 1 and 0, as TGI's;
    ``attention_factor`` unread. Its softmax-scale part, ``(0.1 mscale_all_dim ln s + 1)^2``, is transformers' too."""

    def rule(setting: Setting) -> tuple[str, str]:
        family = attention_tgi if setting.config.get("model_type") in DEEPSEEK_V2_FAMILY else attention
        return yarn_rule(family, betas=True, truncate=True, hf_l=True)(setting)

    return rule


def needs_dict_original(rule: Rule, rope_type: str) -> Rule:
    """TGI's ``static()``: ``rope_scaling["original_max_position_embeddings"]`` for yarn and llama3 (a KeyError
    without it) and a number as ``mscale`` / ``mscale_all_dim`` where present (``get(key, default)`` keeps a null)."""

    def checked(setting: Setting) -> tuple[str, str]:
        params = setting.view.params
        if "original_max_position_embeddings" not in params:
            return "refused", f"{rope_type}: reads original_max_position_embeddings from rope_scaling (KeyError)"
        nulls = [key for key in ("mscale", "mscale_all_dim") if key in params and params[key] is None]
        if rope_type == "yarn" and nulls:
            return "refused", f"yarn: {nulls[0]} null is used as a number (TypeError)"
        return rule(setting)

    return checked


def yarn_rule(attention: Attention, *, betas: bool, truncate: bool, hf_l: bool) -> Rule:
    """YaRN in an engine computing its attention factor with ``attention``; reading the betas and ``truncate`` or
    fixing them (32 / 1, floor and ceil); taking L as transformers does (``hf_l``) or from the dict first."""

    def rule(setting: Setting) -> tuple[str, str]:
        params, factor, length = setting.view.params, setting.factor, setting.original(top_level_first=hf_l)
        hf, own = yarn_attention_hf(params, factor), attention(params, factor)
        gaps = [f"attention factor {own:.4f} where transformers uses {hf:.4f}"] if not math.isclose(hf, own) else []
        if length != setting.original():
            gaps.append(f"L = {length} where transformers uses {setting.original()}")
        if not betas and any(float(params.get(key, value)) != value for key, value in BETAS.items()):
            gaps.append(f"betas fixed at 32/1 (config: {params.get('beta_fast')}/{params.get('beta_slow')})")
        if not truncate and params.get("truncate", True) is False:
            gaps.append("always floors/ceils the ramp (config: truncate false)")
        if gaps:
            return "differs", f"YaRN s={factor:g}: " + "; ".join(gaps)
        return "ok", f"builds YaRN s={factor:g}, L={length}, attention factor {own:.4f} as transformers does"

    return rule


def longrope_attention_hf(setting: Setting) -> float:
    """transformers: ``attention_factor``, else ``sqrt(1 + ln f / ln L)``, f = P / L when L is at the top level."""
    params, top = setting.view.params, setting.top_original
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    factor = setting.positions / top if top else float(params.get("factor", 1.0))
    return math.sqrt(1 + math.log(factor) / math.log(setting.original())) if factor > 1 else 1.0


def longrope_attention_engines(positions: int, length: int) -> float:
    """vLLM, SGLang, TGI: ``sqrt(1 + ln(P / L) / ln L)`` from max_position_embeddings P (1 when P <= L)."""
    return math.sqrt(1 + math.log(positions / length) / math.log(length)) if positions > length else 1.0


def longrope_table(switch: str, *, mscales: bool = True) -> Rule:
    """vLLM / SGLang: the attention factor from P / L (``short_mscale`` / ``long_mscale`` where given and
    ``mscales``), never ``attention_factor``; the long factors switched on as ``switch`` says."""

    def rule(setting: Setting) -> tuple[str, str]:
        length, p, params = setting.original(), setting.positions, setting.view.params
        derived = longrope_attention_engines(p, length)
        given = params if mscales else {}
        short, long = (float(given.get(key, derived)) for key in ("short_mscale", "long_mscale"))
        scales = f"{short:.4f}" if short == long else f"{short:.4f} (short) / {long:.4f} (long)"
        return "differs", (
            f"attention factor {scales} from max_position_embeddings / L = {p}/{length} (transformers: "
            f"{longrope_attention_hf(setting):.4f}); {switch.format(L=length, P=p)}; transformers uses the short "
            f"factors up to {length} tokens and the long ones for a longer sequence"
        )

    return rule


def longrope_llamacpp(setting: Setting) -> tuple[str, str]:
    """llama.cpp: Phi-3's converter (conversion/phi.py) writes the long and short factor tensors and the attention
    factor from P / L (no mscales); the runtime takes the long ones at every position when the context is longer
    than L (``llama_model::get_rope_factors``). Other converters write no factor tensors."""
    if setting.config.get("model_type") != "phi3":
        return ignored("no LongRoPE factor tensors outside Phi-3 (conversion/phi.py), attention factor 1")(setting)
    switch = "long factors at every position when the context (n_ctx) > {L}, else short ones only"
    return longrope_table(switch, mscales=False)(setting)


def longrope_tgi(setting: Setting) -> tuple[str, str]:
    length, params = setting.top_original, setting.view.params
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


SAME = dict.fromkeys(("default", "linear", "llama3"), same)
# Model types whose llama.cpp converter class never writes llama3's per-pair factors (``rope_freqs``; written by
# conversion/llama.py ``LlamaModel.generate_extra_tensors`` and its subclasses, Granite's, EXAONE's, ...): read in
# conversion/{qwen,gptneox,phi,gemma,olmo,stablelm}.py; such a GGUF has plain RoPE (run for Qwen2 and Qwen3).
LLAMA3_WITHOUT_FACTORS = (
    "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gpt_neox", "phi", "phi3",
    "gemma", "gemma2", "olmo", "olmo2", "stablelm",
)  # fmt: skip


def llama3_llamacpp(setting: Setting) -> tuple[str, str]:
    """conversion/llama.py ``LlamaModel.generate_extra_tensors`` computes the ``rope_freqs`` factors with L from
    the rope dict, the top-level one mirrored there (``rope_params.get("original_max_position_embeddings", 8192)``)."""
    model_type = setting.config.get("model_type")
    if model_type in LLAMA3_WITHOUT_FACTORS:
        why = f"llama3: the converter writes no rope_freqs factors for {model_type!r} (it does for Llama classes)"
        return ignored(why)(setting)
    length, expected = setting.llamacpp_original or 8192, setting.original()
    if length != expected:
        return "differs", (
            f"llama3: the converter computes its rope_freqs factors with L = {length} (the rope dict's "
            f"original_max_position_embeddings, else the top level's, else 8192) where transformers uses {expected}"
        )
    return same(setting)
