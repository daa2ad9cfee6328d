"""A model that may carry a patch already: one saved after ``hf_posenc.patch``, or pushed by ``push_to_hub``.

Commands that take a ``--model`` (eval, passkey, push, card) work on the *base* model and apply the
methods they are asked for to it. Given a saved or pushed patched model, they load it through
:func:`hf_posenc.from_pretrained` (a config-only repo's weights and tokenizer come from the base repo and
commit its ``hf_posenc.json`` names) and undo the saved patch, so ``none`` means the base model and the
saved method, asked for again, is the model as it was saved (:attr:`SavedPatch.spec`). A *baked* patch
(GPT-2 ``pi``: the resampled table is in the weights) cannot be undone: the model as saved is the base.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import AutoConfig, PreTrainedConfig, PreTrainedModel

from ..patching import added_tensors, get_patch, unpatch
from ..record import PatchRecord
from ..registry import get_method
from ..spec import format_method_spec
from .errors import HubError, call_hub, refuse_missing_folder
from .metadata import read_metadata
from .push import from_pretrained

_HUB_KWARGS = ("revision", "token", "cache_dir", "local_files_only")
# The attribute of a model from load_base_model whose saved patch added tensors: the record and their saved values.
# On the instance, so a deepcopy or pickle of the model carries them, as it carries a patch.
_SAVED = "_hf_posenc_saved_tensors"


@dataclass(frozen=True)
class SavedPatch:
    """The patch a saved or pushed model carries, and where its weights come from.

    Attributes:
        record (`PatchRecord`): the patch as its config records it.
        weights_from (`str`, *optional*): the repo holding the weights of a config-only push (its
            ``hf_posenc.json``'s ``base_model``); None when the model has its own weights.
        weights_revision (`str`, *optional*): the commit of ``weights_from``.
        weights_gguf_file (`str`, *optional*): the GGUF file in ``weights_from`` that holds the weights.
    """

    record: PatchRecord
    weights_from: str | None = None
    weights_revision: str | None = None
    weights_gguf_file: str | None = None

    @property
    def weights_kwargs(self) -> dict[str, str]:
        """What loading ``weights_from`` takes besides its name: its commit and its GGUF file, where named."""
        given = {"revision": self.weights_revision, "gguf_file": self.weights_gguf_file}
        return {key: value for key, value in given.items() if value is not None}

    @property
    def spec(self) -> str:
        """The saved method as a method spec: its parameters that differ from the method's defaults (the resolved
        ones among them) and from what ``patch`` fills in for the model (ALiBi's paper slopes), less those its
        resolution gives back from the others (YaRN's attention factor from the
        factor). Asked for again, it is the model as saved
        (``yarn:factor=4.0,original_max_position_embeddings=8192``)."""
        method = get_method(self.record.method)
        defaults = {field.name: field.default for field in dataclasses.fields(method.params)}
        filled_in = method.filled_in or (lambda name, value: False)
        given = {
            key: value
            for key, value in self.record.params.items()
            if defaults.get(key) != value and not filled_in(key, value)
        }
        resolved = method.make_params(**given)
        for key in list(given):
            rest = {name: value for name, value in given.items() if name != key}
            with contextlib.suppress(TypeError, ValueError):  # a parameter without which it does not resolve
                if method.make_params(**rest) == resolved:
                    given = rest
        return format_method_spec(self.record.method, given)


def saved_patch(name: str, *, gguf_file: str | None = None, **hub_kwargs: Any) -> SavedPatch | None:
    """The patch that the model ``name`` (Hub id or folder) was saved with, or None: read from its config
    and ``hf_posenc.json`` only (no weights). A GGUF file carries no hf_posenc record.

    Args:
        name (`str`): Hub id or local folder.
        gguf_file (`str`, *optional*): a GGUF file inside ``name``: then None.
        **hub_kwargs: ``revision``, ``token``, ``cache_dir``, ``local_files_only``.
    """
    refuse_missing_folder(name)
    if gguf_file:
        return None
    hub_kwargs = {key: value for key, value in hub_kwargs.items() if key in _HUB_KWARGS and value is not None}
    record = PatchRecord.from_config(read_config(name, **hub_kwargs).to_dict(), missing_ok=True)
    if record is None:
        return None
    metadata = read_metadata(name, **hub_kwargs)
    if metadata is None or metadata["weights"]:
        return SavedPatch(record)
    return SavedPatch(record, metadata["base_model"], metadata.get("base_revision"), metadata.get("base_gguf_file"))


def read_config(name: str, **hub_kwargs: Any) -> PreTrainedConfig:
    """``AutoConfig.from_pretrained``, a failure of the Hub raised as a redacted :class:`HubError`."""
    refuse_missing_folder(name)
    try:
        return call_hub(
            lambda: AutoConfig.from_pretrained(name, **hub_kwargs),
            HubError,
            f"Reading the config of {name!r}",
            hub_kwargs.get("token"),
        )
    except RecursionError:
        raise ValueError(f"The config of {name!r} is nested too deep to read: not a model's config.") from None


def load_base_model(name: str, saved: SavedPatch | None, **kwargs: Any) -> PreTrainedModel:
    """The model ``name`` with the saved patch undone (see the module's docstring): loaded through
    :func:`hf_posenc.from_pretrained` when it was saved patched, else as transformers loads it.

    Args:
        name (`str`): Hub id or local folder.
        saved (`SavedPatch`, *optional*): what :func:`saved_patch` found for ``name``.
        **kwargs: passed to ``from_pretrained`` (``dtype``, ``revision``, ``token``, ``gguf_file``, ...).
    """
    with loading_errors(name, kwargs.get("gguf_file")):
        model = from_pretrained(name, **kwargs)
    if saved is not None and get_patch(model) is not None:
        added = {key: value.detach().clone() for key, value in added_tensors(model).items()}
        unpatch(model)
        if added:
            model.__dict__[_SAVED] = (saved.record, added)
    return model


def restore_saved_tensors(model: PreTrainedModel) -> bool:
    """On a model from :func:`load_base_model` patched again with its saved method and parameters: the tensors that
    patch adds (the T5 bias table) take their saved, trained values, so the saved method is the model as saved
    rather than the patch's fresh start. Returns whether it did (False for any other patch)."""
    entry, applied = model.__dict__.get(_SAVED), get_patch(model)
    if entry is None or applied is None:
        return False
    record, tensors = entry
    if record.method != applied.method or _without_backend(record.params) != _without_backend(applied.params):
        return False
    state = added_tensors(model)
    with torch.no_grad():
        for key, value in tensors.items():
            state[key].copy_(value)
    return True


def saved_tensors(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """The tensors the saved patch of a model from :func:`load_base_model` had added, as saved (its trained T5
    table), by name; empty for any other model."""
    entry = model.__dict__.get(_SAVED)
    return dict(entry[1]) if entry is not None else {}


def _without_backend(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters but the backend: the record keeps the one asked for (``auto``), a patch reports the one chosen."""
    return {key: value for key, value in params.items() if key != "backend"}


def base_config(name: str, saved: SavedPatch | None, **hub_kwargs: Any) -> PreTrainedConfig:
    """The config of the base model of ``name``: its saved patch's changes put back (a baked patch's stay,
    as its weights do)."""
    hub_kwargs = {key: value for key, value in hub_kwargs.items() if key in _HUB_KWARGS and value is not None}
    config = read_config(name, **hub_kwargs)
    if saved is None or saved.record.baked:
        return config
    return saved.record.base_config(config)


@contextlib.contextmanager
def loading_errors(name: str, gguf_file: str | None = None) -> Iterator[None]:
    """The loaders' errors on damaged or refused files as one-line ``ValueError``: a pickle checkpoint torch's
    safe loading refuses (never loaded otherwise), a GGUF or safetensors file that does not parse (truncated?),
    weights whose shapes are not the config's."""
    try:
        yield
    except SafetensorError as error:
        raise ValueError(
            f"{name}: cannot read its safetensors weights ({error}). A truncated or damaged file fails so: download "
            "or save it again."
        ) from None
    except pickle.UnpicklingError as error:
        found = re.search(r"WeightsUnpickler error: (.*?)(\.\s|$)", str(error), re.MULTILINE)
        reason = f" ({found.group(1)})" if found else ""
        raise ValueError(
            f"{name}: torch refused to load a pickle checkpoint with weights_only{reason}; hf_posenc never "
            "loads pickles unsafely: use a safetensors copy of the model."
        ) from None
    except RuntimeError as error:
        if "ignore_mismatched_sizes" not in str(error):
            raise
        raise ValueError(
            f"{name}: its weights do not have the shapes its config.json gives (an edited config, or weights of "
            "another model); transformers' load report above lists them."
        ) from None
    except (struct.error, ValueError, IndexError, EOFError, KeyError) as error:
        if not gguf_file:
            raise
        path = Path(name) / gguf_file
        size = f" ({path.stat().st_size} bytes)" if path.is_file() else ""
        raise ValueError(
            f"Cannot read the GGUF file {path}{size}: {type(error).__name__}: {error}. A truncated or damaged file "
            "fails so: download it again."
        ) from None
