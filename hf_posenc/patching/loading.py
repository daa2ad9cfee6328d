"""Load a saved patched model: build the base model, then apply the patch its config records."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, cached_file

from ..record import PatchRecord
from ..registry import get_method
from .apply import added_tensors, patch
from .dispatch import planner_for_config
from .legacy import ENGINE_KEYS, LEGACY_KEYS

logger = logging.getLogger("hf_posenc")

_CONFIG_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "subfolder", "gguf_file")
# Keys a patch writes for other readers only: neither hf_posenc nor transformers 5 builds the model from them.
_FOR_OTHER_READERS = (*LEGACY_KEYS, *ENGINE_KEYS)


def load_patched_model(pretrained_model_name_or_path: str, **kwargs: Any) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_pretrained`` for a model saved (or pushed) after ``hf_posenc.patch``.

    The model is built with the base config and patched with the recorded method, so
    ``hf_posenc.unpatch`` gives the base model back. Configs without a patch, and ``baked`` patches (GPT-2
    ``pi``: the change is in the weights), load as saved.

    The record wins over the rest of the config: hf_posenc applies the method and parameters the record names.
    Where the saved values the patch sets (``rope_parameters``, ``max_position_embeddings``, ...) are not what
    the record gives (one of them was edited by hand), a warning on the ``hf_posenc`` logger names both values;
    plain transformers, which ignores the record, would build the model from the config's.

    Tensors the patch adds to the model (the T5 bias table) are read from the checkpoint after the patch.

    Args:
        pretrained_model_name_or_path (`str`): Hub id or local folder.
        **kwargs: passed to ``AutoModelForCausalLM.from_pretrained`` (``dtype``, ``device_map``, ...); the
            method's planner may read some first (ALiBi: ``attn_implementation`` picks its backend,
            ``"sdpa"`` or ``"hf_posenc_alibi_sdpa"`` the sdpa one, instead of the recorded one).
    """
    if kwargs.get("trust_remote_code"):
        raise ValueError("hf_posenc never loads remote code; trust_remote_code=True is refused.")
    config_kwargs = {key: kwargs[key] for key in _CONFIG_KWARGS if key in kwargs}
    _refuse_unmerged_adapters(pretrained_model_name_or_path, config_kwargs)
    given = kwargs.pop("config", None)  # copied: the caller's object is neither changed nor shared with the model
    config = (
        copy.deepcopy(given)
        if given is not None
        else AutoConfig.from_pretrained(pretrained_model_name_or_path, **config_kwargs)
    )
    record = PatchRecord.from_config(config, missing_ok=True)
    if record is None or record.baked:
        return AutoModelForCausalLM.from_pretrained(pretrained_model_name_or_path, config=config, **kwargs)
    # the file as written: transformers 5 reads 4.x's rope_scaling over an edited rope_parameters
    in_file = (
        None
        if given is not None
        else PretrainedConfig.get_config_dict(pretrained_model_name_or_path, **config_kwargs)[0]
    )
    base_config = record.base_config(config)
    params, kwargs = _loading(record, base_config, kwargs)
    model = AutoModelForCausalLM.from_pretrained(pretrained_model_name_or_path, config=base_config, **kwargs)
    patch(model, record.method, **params)
    _load_added_tensors(model, pretrained_model_name_or_path, config_kwargs)
    _warn_where_edited(pretrained_model_name_or_path, config, in_file, model.config, record)
    return model


def _loading(
    record: PatchRecord, base_config: PretrainedConfig, kwargs: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The parameters to patch with and the ``from_pretrained`` arguments to build the base with: the method's
    planner may pick its backend from ``attn_implementation`` (raising :class:`NoCounterpart` for a name it
    cannot run) and build the base with another."""
    params = dict(record.params)
    planner = planner_for_config(base_config, get_method(record.method))
    if planner is not None and planner.loading is not None:
        params, kwargs = planner.loading(params, kwargs)
    return params, kwargs


def base_attn_implementation(config: PretrainedConfig, attn_implementation: str) -> str:
    """The implementation :func:`load_patched_model` builds the base model with when asked for
    ``attn_implementation`` on a model saved with ``config``: the name itself where the config records no patch.

    Raises:
        NoCounterpart: the saved patch cannot run ``attn_implementation``.
    """
    record = PatchRecord.from_config(config, missing_ok=True)
    if record is None or record.baked:
        return attn_implementation
    _, kwargs = _loading(record, record.base_config(config), {"attn_implementation": attn_implementation})
    return kwargs["attn_implementation"]


def _refuse_unmerged_adapters(source: str, config_kwargs: dict[str, Any]) -> None:
    """Raise ``ValueError`` where the safetensors weights of the local folder ``source`` are those of peft adapter
    layers, not merged (``...q_proj.base_layer.weight``, ``...q_proj.lora_A.default.weight``): the checkpoints of a
    LoRA run, which resume it; loaded, every layer they adapt would be new, the load report aside."""
    folder = Path(source) / config_kwargs.get("subfolder", "")
    if config_kwargs.get("gguf_file") or not folder.is_dir():
        return
    index, single = folder / SAFE_WEIGHTS_INDEX_NAME, folder / SAFE_WEIGHTS_NAME
    try:  # the file transformers loads: the single one first; one it cannot read is left to it to say so
        if single.is_file():
            with safe_open(single, framework="pt") as checkpoint:
                names = list(checkpoint.keys())
        elif index.is_file():
            names = list(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
        else:
            return
    except (OSError, ValueError, KeyError, TypeError, SafetensorError):
        return
    adapted = sorted(name for name in names if ".base_layer." in name or ".lora_A." in name)
    if adapted:
        raise ValueError(
            f"{source} holds the weights of peft adapter layers, not merged ({adapted[0]}, ...): a checkpoint of a "
            "LoRA run (hf-posenc train --trainable lora), which resumes it (--resume). Loaded, each layer it adapts "
            "would be new; load the run's output folder, where the adapters are merged into the weights."
        )


def _load_added_tensors(model: PreTrainedModel, source: str, hub_kwargs: dict[str, Any]) -> None:
    """The values saved for the tensors the patch added to the model (the T5 bias table, trained): the base model
    was built without them, so they are read from the checkpoint's safetensors now. Where the checkpoint has none
    (a config-only push: its weights are the base's), the patch's initial values stay, and a log line says so."""
    added = added_tensors(model)
    if not added:
        return
    saved = read_checkpoint_tensors(source, list(added), **hub_kwargs)
    missing = sorted(set(added) - set(saved))
    if missing:
        logger.warning(
            "hf_posenc: %s holds no saved value of %s, which the patch adds; they keep their initial values.",
            source,
            ", ".join(missing),
        )
    with torch.no_grad():
        for name, value in saved.items():
            added[name].copy_(value)
    if saved:
        logger.warning(
            "hf_posenc: loaded %s, which the patch adds (a load report of transformers above may list it as "
            "unexpected: the base model, built first, has no such tensor).",
            ", ".join(sorted(saved)),
        )


def read_checkpoint_tensors(source: str, names: list[str], **hub_kwargs: Any) -> dict[str, torch.Tensor]:
    """The tensors called ``names`` in the safetensors checkpoint of ``source`` (Hub id or folder; one file or
    sharded with an index), those it has; an empty dict where it has no safetensors checkpoint."""
    hub_kwargs = {key: value for key, value in hub_kwargs.items() if key != "gguf_file"}
    index = cached_file(source, SAFE_WEIGHTS_INDEX_NAME, _raise_exceptions_for_missing_entries=False, **hub_kwargs)
    if index is not None:
        weight_map = json.loads(Path(index).read_text())["weight_map"]
        files = {name: weight_map[name] for name in names if name in weight_map}
    else:
        files = dict.fromkeys(names, SAFE_WEIGHTS_NAME)
    found: dict[str, torch.Tensor] = {}
    for file in sorted(set(files.values())):
        path = cached_file(source, file, _raise_exceptions_for_missing_entries=False, **hub_kwargs)
        if path is None:
            continue
        with safe_open(path, framework="pt") as checkpoint:
            available = set(checkpoint.keys())
            found.update({name: checkpoint.get_tensor(name) for name in available.intersection(names)})
    return found


def _warn_where_edited(
    source: str, saved: Any, in_file: dict[str, Any] | None, patched: Any, record: PatchRecord
) -> None:
    """Warn, naming both values, where the saved config and the record's patch of the base disagree: the config as
    transformers 5 reads it (4.x's keys read into ``rope_parameters``, ``type`` too, which is dropped here where it
    repeats ``rope_type``) and, where they differ, the file's own values (``in_file``: an edited
    ``rope_parameters`` that 4.x's keys hide from transformers)."""
    differences: dict[str, None] = {}
    for key in record.base:
        if key in _FOR_OTHER_READERS:
            continue
        expected = _without_legacy_type(getattr(patched, key, None))
        readings = [getattr(saved, key, None)] + ([in_file[key]] if in_file and key in in_file else [])
        for reading in readings:
            for name, in_config, from_record in _differences(key, _without_legacy_type(reading), expected):
                differences[f"{name} is {in_config!r} in the config, {from_record!r} from the record"] = None
    if differences:
        logger.warning(
            "hf_posenc: the config of %s disagrees with its hf_posenc record (%s): %s. hf_posenc applies the "
            "record; plain transformers would build the model from the config's values.",
            source,
            record.spec,
            "; ".join(differences),  # in order, each once
        )


def _without_legacy_type(value: Any) -> Any:
    """``rope_parameters`` without 4.x's ``type``, an alias of the ``rope_type`` compared anyway: a file read with
    4.x's ``rope_scaling`` copies it in, and a base loaded from a 4.x config may keep a stale one."""
    if isinstance(value, dict) and "type" in value:
        return {key: entry for key, entry in value.items() if key != "type"}
    return value


def _differences(key: str, saved: Any, patched: Any) -> list[tuple[str, Any, Any]]:
    """``(name, saved, patched)`` for each differing value; dicts (``rope_parameters``) entry by entry."""
    if isinstance(saved, dict) and isinstance(patched, dict):
        names = {**saved, **patched}
        return [
            (f"{key}[{name!r}]", saved.get(name), patched.get(name))
            for name in names
            if saved.get(name) != patched.get(name)
        ]
    return [] if saved == patched else [(key, saved, patched)]
