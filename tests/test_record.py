"""The ``hf_posenc`` entry of a patched config: one record type, written and read back the same."""

from __future__ import annotations

import json

import pytest
from tiny_models import make_tiny

import hf_posenc
from hf_posenc.record import CONFIG_KEY, PatchRecord
from hf_posenc.registry import get_method
from hf_posenc.spec import parse_method_spec


def test_the_record_a_patch_writes_reads_back_equal(tmp_path):
    model = make_tiny("llama")
    base = model.config.to_dict()
    hf_posenc.patch(model, "yarn", factor=4)
    record = PatchRecord.from_config(model.config)
    assert (record.method, record.native, record.baked, record.version) == ("yarn", True, False, hf_posenc.__version__)
    assert record.params["factor"] == 4.0 and record.params["original_max_position_embeddings"] == 64
    assert record.base == {  # the 4.x keys the patch adds beside rope_parameters: absent (None) in the base
        "rope_parameters": base["rope_parameters"],
        "max_position_embeddings": 64,
        "rope_scaling": None,
        "rope_theta": None,
    }
    assert record.base_max_position_embeddings == 64
    assert record.to_dict() == getattr(model.config, CONFIG_KEY)
    assert record.base_config(model.config).to_dict() == base
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert PatchRecord.from_config(saved) == record  # from a config's dict too


def test_the_spec_leaves_unset_parameters_out_and_reads_back_as_the_same_method():
    """The card's Specification line showed ``mscale=null,mscale_all_dim=null`` for a default YaRN."""
    record = PatchRecord.from_config(hf_posenc.patch(make_tiny("llama"), "yarn", factor=4).config)
    assert record.params["mscale"] is None and "null" not in record.spec
    name, params = parse_method_spec(record.spec)
    assert get_method(name).make_params(**params) == get_method("yarn").make_params(**record.params)


def test_baked_is_written_only_when_set():
    gpt2 = hf_posenc.patch(make_tiny("gpt2"), "pi", factor=2)
    assert PatchRecord.from_config(gpt2.config).baked and getattr(gpt2.config, CONFIG_KEY)["baked"] is True
    assert "baked" not in PatchRecord("yarn", {}, True).to_dict()


def test_an_unpatched_config_has_no_record():
    config = make_tiny("llama").config
    assert PatchRecord.from_config(config, missing_ok=True) is None
    with pytest.raises(ValueError, match="not patched by hf_posenc"):
        PatchRecord.from_config(config)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("yarn", "record is a str, not an object"),
        ({"params": {}}, "record has no 'method' field"),
        ({"method": "yarn"}, "record has no 'params' field"),
        ({"method": 3, "params": {}, "base": {}}, "has a int as 'method'; expected a str"),
        ({"method": "yarn", "params": "factor=4"}, "has a str as 'params'; expected a dict"),
        ({"method": "yarn", "params": {}}, "record has no 'base' field"),
        ({"method": "yarn", "params": {}, "base": None}, "record has no 'base' field"),
        ({"method": "yarn", "params": {}, "base": []}, "has a list as 'base'; expected a dict"),
        ({"method": "yarn", "params": {}, "base": {}, "native": "yes"}, "has a str as 'native'; expected a bool"),
    ],
)
def test_a_malformed_record_is_a_clear_error(entry, message):
    with pytest.raises(ValueError, match=message):
        PatchRecord.from_config({CONFIG_KEY: entry})


def test_a_record_without_a_version_says_so():
    record = PatchRecord.from_config({CONFIG_KEY: {"method": "yarn", "params": {}, "base": {}, "version": None}})
    assert record.version is None and not record.native
