"""Load a saved patched model: build the base model, then apply the patch its config records."""

from __future__ import annotations

from typing import Any

from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from .alibi_patch import loading_backend
from .config import split_patched_config
from .patching import patch

_CONFIG_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "subfolder", "gguf_file")


def from_pretrained(pretrained_model_name_or_path: str, **kwargs: Any) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_pretrained`` for a model saved (or pushed) after ``hf_posenc.patch``.

    The model is built with the base config and patched with the recorded method, so
    ``hf_posenc.unpatch`` gives the base model back. Configs without a patch load unchanged.

    Args:
        pretrained_model_name_or_path (`str`): Hub id or local folder.
        **kwargs: passed to ``AutoModelForCausalLM.from_pretrained`` (``dtype``, ``device_map``, ...). For
            an ALiBi model ``attn_implementation`` picks the ALiBi backend (``"sdpa"`` or
            ``"hf_posenc_alibi_sdpa"``: the sdpa backend) instead of the recorded one.
    """
    if kwargs.get("trust_remote_code"):
        raise ValueError("hf_posenc never loads remote code; trust_remote_code=True is refused.")
    config_kwargs = {key: kwargs[key] for key in _CONFIG_KWARGS if key in kwargs}
    config = kwargs.pop("config", None) or AutoConfig.from_pretrained(pretrained_model_name_or_path, **config_kwargs)
    base_config, method, params = split_patched_config(config)
    if "backend" in params and kwargs.get("attn_implementation") is not None:  # ALiBi: the backend asked for
        params["backend"], kwargs["attn_implementation"] = loading_backend(kwargs["attn_implementation"])
    model = AutoModelForCausalLM.from_pretrained(pretrained_model_name_or_path, config=base_config, **kwargs)
    if method is not None:
        patch(model, method, **params)
    return model
