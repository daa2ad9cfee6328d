"""One table per family of attention functions: registration, the backend reported, loading with
``attn_implementation=`` and the no-counterpart error all read it."""

from __future__ import annotations

import pytest
from tiny_models import make_tiny
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import hf_posenc
from hf_posenc.attention import ALIBI, REMAP, T5, TABLES, TEMPERATURE
from hf_posenc.patching.changes import NoCounterpart


def test_every_backend_of_every_table_is_registered_with_its_functions():
    names = [backend.implementation for table in TABLES for backend in table.backends]
    assert len(names) == len(set(names))
    for table in TABLES:
        for backend in table.backends:
            assert ALL_ATTENTION_FUNCTIONS[backend.implementation] is backend.attention
            assert ALL_MASK_ATTENTION_FUNCTIONS[backend.implementation] is backend.mask
            assert table.backend_of(backend.implementation) == backend.name


@pytest.mark.parametrize(
    "table,asked,backend,base",
    [
        (ALIBI, "sdpa", "sdpa", "sdpa"),
        (ALIBI, "flex_attention", "flex", "sdpa"),
        (ALIBI, "hf_posenc_alibi_cudnn", "cudnn", "sdpa"),
        (T5, "eager", "eager", "eager"),
        (REMAP, "hf_posenc_extension_blocked", "blocked", "sdpa"),
        (TEMPERATURE, "hf_posenc_logn_eager", "eager", "eager"),
        (TEMPERATURE, "flash_attention_2", "flash_attention_2", "flash_attention_2"),
    ],
)
def test_a_name_asked_at_load_selects_a_backend_and_the_base_models_implementation(table, asked, backend, base):
    chosen = table.for_loading(asked)
    assert (chosen.name, chosen.base) == (backend, base)


def test_a_name_with_no_counterpart_names_the_tables_own_choices(tmp_path):
    assert ALIBI.for_loading("flash_attention_2") is None and REMAP.for_loading("hf_posenc_alibi_sdpa") is None
    model = hf_posenc.patch(make_tiny("llama"), "dca")
    model.save_pretrained(tmp_path)
    with pytest.raises(NoCounterpart) as raised:
        hf_posenc.from_pretrained(tmp_path, attn_implementation="flash_attention_2")
    assert raised.value.standard == REMAP.standard_names == ["eager", "sdpa", "flex_attention"]
    assert raised.value.own == REMAP.implementations


def test_get_patch_reports_the_backend_running_now():
    model = hf_posenc.patch(make_tiny("llama"), "alibi", backend="sdpa")
    model.set_attn_implementation(ALIBI.implementation("eager"))
    assert hf_posenc.get_patch(model).params["backend"] == "eager"
