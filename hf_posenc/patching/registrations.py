"""Everything hf_posenc adds to transformers' global registries, done once at import.

* rope types: ``ROPE_INIT_FUNCTIONS["hf_posenc"]`` and ``["hf_posenc_dynamic"]`` compute the frequencies
  of methods transformers cannot express (:func:`hf_posenc.patching.rope_types.own_rope_init`);
  ``hf_posenc_alibi``, ``hf_posenc_nope``, ``hf_posenc_t5_bias`` and ``hf_posenc_extension`` get no init
  function on purpose: plain transformers must refuse such a config.
* attention: every backend of :mod:`hf_posenc.attention.backends`' tables, its attention function and mask function
  under its implementation name (``hf_posenc_alibi_sdpa``, ``hf_posenc_t5_flex``, ``hf_posenc_extension_blocked``,
  ``hf_posenc_logn_sdpa``), with ``AttentionInterface`` and ``AttentionMaskInterface``.

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
from transformers.masking_utils import AttentionMaskInterface
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ..attention import TABLES
from .rope_types import OWN_DYNAMIC_ROPE_TYPE, OWN_ROPE_TYPE, OWN_ROPE_TYPES, own_rope_init

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
for _table in TABLES:
    for _backend in _table.backends:
        AttentionInterface.register(_backend.implementation, _backend.attention)
        AttentionMaskInterface.register(_backend.implementation, _backend.mask)
_rope_logger = logging.getLogger(ROPE_VALIDATION_LOGGER)
if not any(isinstance(existing, _OwnRopeTypesFilter) for existing in _rope_logger.filters):
    _rope_logger.addFilter(_OwnRopeTypesFilter())
