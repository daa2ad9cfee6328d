"""The ``hf_posenc`` entry a patch writes into a model's config: one record type, read and written here only.

It names the method and its resolved parameters and keeps the base model's value of every config
attribute the patch changed, so that ``unpatch`` and :func:`hf_posenc.from_pretrained` can undo and
redo the patch, and the card and the Hub layer can describe it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from ._version import __version__
from .spec import format_method_spec

CONFIG_KEY = "hf_posenc"


@dataclass(frozen=True)
class PatchRecord:
    """What ``hf_posenc.patch`` wrote into ``config.hf_posenc``.

    Attributes:
        method (`str`): canonical method name.
        params (`dict`): the method's parameters as resolved on the model (ALiBi: the backend asked for).
        native (`bool`): the config says the method in transformers' own vocabulary.
        base (`dict`): config attribute -> its value before the patch (None for one the patch added).
        baked (`bool`): the change is in the weights (GPT-2 ``pi``'s resampled table), so the config as
            saved is the model: nothing to redo when loading.
        version (`str`, *optional*): the hf_posenc version that wrote it (None where a record does not say).
    """

    method: str
    params: dict[str, Any]
    native: bool
    base: dict[str, Any] = field(default_factory=dict)
    baked: bool = False
    version: str | None = __version__

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready entry (``baked`` only when set: an entry without it is not baked)."""
        entry = {"method": self.method, "params": copy.deepcopy(self.params), "native": self.native}
        entry["base"] = copy.deepcopy(self.base)
        if self.baked:
            entry["baked"] = True
        return {**entry, "version": self.version}

    @classmethod
    def from_config(cls, config: Any, *, missing_ok: bool = False) -> PatchRecord | None:
        """The record of a transformers config (or its ``to_dict()``).

        Raises:
            ValueError: the config has no record (unless ``missing_ok``: then None), or a malformed one
                (the field that is wrong is named).
        """
        entry = config.get(CONFIG_KEY) if isinstance(config, dict) else getattr(config, CONFIG_KEY, None)
        if entry is None:
            if missing_ok:
                return None
            raise ValueError(
                f"The model is not patched by hf_posenc (its config has no {CONFIG_KEY!r} record); "
                "call hf_posenc.patch(model, method, ...) first."
            )
        if not isinstance(entry, dict):
            raise ValueError(f"The config's {CONFIG_KEY!r} record is a {type(entry).__name__}, not an object.")
        expected = {"method": str, "params": dict, "native": bool, "base": dict, "baked": bool, "version": str}
        for key, kind in expected.items():
            if key in ("method", "params", "base") and entry.get(key) is None:
                raise ValueError(f"The config's {CONFIG_KEY!r} record has no {key!r} field.")
            if entry.get(key) is not None and not isinstance(entry[key], kind):
                raise ValueError(
                    f"The config's {CONFIG_KEY!r} record has a {type(entry[key]).__name__} as {key!r}; "
                    f"expected a {kind.__name__}."
                )
        known = {key: copy.deepcopy(entry[key]) for key in expected if entry.get(key) is not None}
        return cls(**{"native": False, "version": None, **known})

    @property
    def spec(self) -> str:
        """The method and its parameters as a specification string (``yarn:factor=4.0,...``); parameters left unset
        (None, the default of each optional one) are left out."""
        return format_method_spec(self.method, {key: value for key, value in self.params.items() if value is not None})

    @property
    def base_max_position_embeddings(self) -> int | None:
        """The base model's ``max_position_embeddings`` where the patch changed it."""
        return self.base.get("max_position_embeddings")

    def base_config(self, config: Any) -> Any:
        """A copy of ``config`` with the base values put back and the record removed: the unpatched model's."""
        base = copy.deepcopy(config)
        for key, value in self.base.items():
            declared = hasattr(type(base), key) and not _is_property(base, key)
            if value is None and not declared:  # an attribute the patch added (vLLM's DCA keys, 4.x's rope_scaling)
                base.__dict__.pop(key, None)
            else:
                set_config_attribute(base, key, copy.deepcopy(value))
        delattr(base, CONFIG_KEY)
        return base


def _is_property(config: Any, key: str) -> bool:
    return isinstance(getattr(type(config), key, None), property)


def set_config_attribute(config: Any, key: str, value: Any) -> None:
    """``config.key = value``; for a property of the config class (transformers 5's ``rope_scaling``, an alias
    of ``rope_parameters``) the instance's own entry instead, which ``to_dict`` writes out and the alias's
    target never sees."""
    if _is_property(config, key):
        config.__dict__[key] = value
    else:
        setattr(config, key, value)
