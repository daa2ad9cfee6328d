"""Everything hf_posenc adds to transformers' global registries, done once at import.

* rope types: ``ROPE_INIT_FUNCTIONS["hf_posenc"]`` and ``["hf_posenc_dynamic"]`` compute the frequencies
  of methods transformers cannot express (:func:`hf_posenc.patching.rope_types.own_rope_init`);
  ``hf_posenc_alibi``, ``hf_posenc_nope``, ``hf_posenc_t5_bias`` and ``hf_posenc_extension`` get no init
  function on purpose: plain transformers must refuse such a config.
* attention: each ALiBi backend's attention function and mask function, under ``hf_posenc_alibi_<backend>``,
  with ``AttentionInterface`` and ``AttentionMaskInterface``; likewise the T5 bias's (``hf_posenc_t5_<backend>``),
  the Self-Extend / DCA backends (``hf_posenc_extension_<backend>``) and log-n's wrappers of the standard
  implementations (``hf_posenc_logn_<implementation>``, with that implementation's own mask function).

The names are namespaced and the additions harmless to models that do not use them. Nothing else in
transformers changes: no class and no module attribute.

Why hf_posenc's rope types have no transformers validation function: transformers validates
``rope_parameters`` by calling ``_validate_<rope_type>_rope_parameters`` looked up as an attribute of the
config (``RotaryEmbeddingConfigMixin.validate_rope``); there is no registry to add one to, and setting it
on the config instance would write it into ``config.json``. So the one way would be to add methods to a
transformers class, which hf_posenc does not do. Without one, transformers logs "Missing validation
function" for every config of these types; :class:`_OwnRopeTypesFilter` drops exactly that line for these
types (a logging filter, not a change to transformers). hf_posenc validates them itself:
:func:`~hf_posenc.patching.rope_types.own_rope_init` builds the method's parameters (an unknown method or
a bad value raises when the model is built) and :class:`~hf_posenc.record.PatchRecord` checks the record.
"""

from __future__ import annotations

import logging

from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .attention import (
    EXTENSION_FUNCTIONS,
    EXTENSION_IMPLEMENTATIONS,
    FUNCTIONS,
    IMPLEMENTATIONS,
    T5_FUNCTIONS,
    T5_IMPLEMENTATIONS,
    TEMPERATURE_FUNCTIONS,
    TEMPERATURE_IMPLEMENTATIONS,
    extension_mask,
)
from .patching.rope_types import OWN_DYNAMIC_ROPE_TYPE, OWN_ROPE_TYPE, OWN_ROPE_TYPES, own_rope_init

ROPE_VALIDATION_LOGGER = "transformers.modeling_rope_utils"


class _OwnRopeTypesFilter(logging.Filter):
    """Drops transformers' "Missing validation function" warning for hf_posenc's own rope types only."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (
            message.startswith("Missing validation function")
            and any(f"'rope_type'='{rope_type}'" in message for rope_type in OWN_ROPE_TYPES)
        )


ROPE_INIT_FUNCTIONS.setdefault(OWN_ROPE_TYPE, own_rope_init)
ROPE_INIT_FUNCTIONS.setdefault(OWN_DYNAMIC_ROPE_TYPE, own_rope_init)
for _backend, (_attention, _mask) in FUNCTIONS.items():
    AttentionInterface.register(IMPLEMENTATIONS[_backend], _attention)
    AttentionMaskInterface.register(IMPLEMENTATIONS[_backend], _mask)
for _backend, (_attention, _mask) in T5_FUNCTIONS.items():
    AttentionInterface.register(T5_IMPLEMENTATIONS[_backend], _attention)
    AttentionMaskInterface.register(T5_IMPLEMENTATIONS[_backend], _mask)
for _backend, _attention in EXTENSION_FUNCTIONS.items():
    AttentionInterface.register(EXTENSION_IMPLEMENTATIONS[_backend], _attention)
    AttentionMaskInterface.register(EXTENSION_IMPLEMENTATIONS[_backend], extension_mask)
for _base, _attention in TEMPERATURE_FUNCTIONS.items():  # log-n alone: the base's own masks
    AttentionInterface.register(TEMPERATURE_IMPLEMENTATIONS[_base], _attention)
    AttentionMaskInterface.register(TEMPERATURE_IMPLEMENTATIONS[_base], ALL_MASK_ATTENTION_FUNCTIONS[_base])
_rope_logger = logging.getLogger(ROPE_VALIDATION_LOGGER)
if not any(isinstance(existing, _OwnRopeTypesFilter) for existing in _rope_logger.filters):
    _rope_logger.addFilter(_OwnRopeTypesFilter())
