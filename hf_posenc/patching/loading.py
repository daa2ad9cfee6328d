"""Load a saved patched model: build the base model, then apply the patch its config records."""

from __future__ import annotations

import copy
from typing import Any

from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from ..record import PatchRecord
from ..registry import get_method
from .apply import patch
from .dispatch import planner_for_config

_CONFIG_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "subfolder", "gguf_file")


def load_patched_model(pretrained_model_name_or_path: str, **kwargs: Any) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_pretrained`` for a model saved (or pushed) after ``hf_posenc.patch``.

    The model is built with the base config and patched with the recorded method, so
    ``hf_posenc.unpatch`` gives the base model back. Configs without a patch, and ``baked`` patches (GPT-2
    ``pi``: the change is in the weights), load as saved.

    Args:
        pretrained_model_name_or_path (`str`): Hub id or local folder.
        **kwargs: passed to ``AutoModelForCausalLM.from_pretrained`` (``dtype``, ``device_map``, ...); the
            method's planner may read some first (ALiBi: ``attn_implementation`` picks its backend,
            ``"sdpa"`` or ``"hf_posenc_alibi_sdpa"`` the sdpa one, instead of the recorded one).
    """
    if kwargs.get("trust_remote_code"):
        raise ValueError("hf_posenc never loads remote code; trust_remote_code=True is refused.")
    config_kwargs = {key: kwargs[key] for key in _CONFIG_KWARGS if key in kwargs}
    given = kwargs.pop("config", None)  # copied: the caller's object is neither changed nor shared with the model
    config = (
        copy.deepcopy(given)
        if given is not None
        else AutoConfig.from_pretrained(pretrained_model_name_or_path, **config_kwargs)
    )
    record = PatchRecord.from_config(config, missing_ok=True)
    if record is None or record.baked:
        return AutoModelForCausalLM.from_pretrained(pretrained_model_name_or_path, config=config, **kwargs)
    base_config, params = record.base_config(config), dict(record.params)
    planner = planner_for_config(base_config, get_method(record.method))
    if planner is not None and planner.loading is not None:
        params, kwargs = planner.loading(params, kwargs)
    model = AutoModelForCausalLM.from_pretrained(pretrained_model_name_or_path, config=base_config, **kwargs)
    return patch(model, record.method, **params)
