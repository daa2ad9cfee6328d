"""The config a patch writes: save/load round trips, with and without hf_posenc installed."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
import transformers
from helpers import plain_load
from tiny_models import make_tiny
from transformers import AutoConfig

import hf_posenc
from hf_posenc.record import PatchRecord

pytestmark = pytest.mark.xdist_group("rope-types")  # its module fixtures are built once, on one worker

PAIRS = 8  # tiny llama: head_dim 16
CASES = {
    "pi": {"factor": 4},
    "ntk": {"factor": 4},
    "dynamic-ntk": {"factor": 4},
    "ntk-by-parts": {"factor": 4},
    "yarn": {"factor": 4},
    "yarn-ratio": {"factor": 4, "ramp": "ratio"},
    "dynamic-yarn": {},
    "llama3": {"factor": 8},
    "longrope": {"factor": 4, "long_factor": [1.0 + i / 4 for i in range(PAIRS)]},
}
NATIVE_TYPES = {
    "pi": "linear",
    "ntk": "default",
    "dynamic-ntk": "dynamic",
    "ntk-by-parts": "yarn",
    "yarn": "yarn",
    "llama3": "llama3",
    "longrope": "longrope",
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each case patched, its logits at a length past L taken, and saved with save_pretrained."""
    root = tmp_path_factory.mktemp("saved")
    ids = torch.randint(0, 97, (1, 200), generator=torch.Generator().manual_seed(0))
    torch.save(ids, root / "ids.pt")
    cases = {}
    for case, params in CASES.items():
        model = make_tiny("llama")
        with torch.no_grad():
            base = model(ids).logits
        hf_posenc.patch(model, case.removesuffix("-ratio"), **params)
        with torch.no_grad():
            logits = model(ids).logits
        model.save_pretrained(root / case)
        cases[case] = {"dir": root / case, "logits": logits, "base": base, "info": hf_posenc.get_patch(model)}
    plain = plain_load(str(root / "ids.pt"), *(str(c["dir"]) for c in cases.values()))
    for case in cases.values():
        case["plain"] = plain[str(case["dir"])]
    return ids, cases


@pytest.mark.parametrize("case", sorted(NATIVE_TYPES))
def test_native_config_loads_identically_without_hf_posenc(saved, case):
    _, cases = saved
    entry = cases[case]
    assert entry["info"].native
    assert entry["plain"] == "loaded"
    assert json.loads((entry["dir"] / "config.json").read_text())["rope_parameters"]["rope_type"] == NATIVE_TYPES[case]
    assert torch.equal(torch.load(entry["dir"] / "plain_logits.pt"), entry["logits"])


@pytest.mark.parametrize("case", ["yarn-ratio", "dynamic-yarn"])
def test_own_config_never_loads_silently_without_hf_posenc(saved, case):
    _, cases = saved
    entry = cases[case]
    assert not entry["info"].native
    assert entry["plain"].startswith("KeyError") and "hf_posenc" in entry["plain"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_from_pretrained_restores_the_patch_and_unpatch_gives_the_base(saved, case, caplog):
    ids, cases = saved
    entry = cases[case]
    with caplog.at_level(logging.WARNING, logger="hf_posenc"):
        model = hf_posenc.from_pretrained(str(entry["dir"]), attn_implementation="eager").eval()
    assert [r for r in caplog.records if "disagrees" in r.getMessage()] == []  # config and record agree
    assert hf_posenc.get_patch(model) == entry["info"]
    with torch.no_grad():
        assert torch.equal(model(ids).logits, entry["logits"])
        hf_posenc.unpatch(model)
        assert torch.equal(model(ids).logits, entry["base"])
    assert not hasattr(model.config, "hf_posenc")
    assert model.config.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}


EDITS = [  # config.json says the method twice (rope_scaling for transformers 4.x, which 5.x reads first too): edited in both
    ("factor", lambda config: [config[key].update(factor=8.0) for key in ("rope_parameters", "rope_scaling")], ["rope_parameters['factor'] is 8.0 in the config, 4.0 from the record"]),
    ("rope type", lambda config: config.update(rope_parameters={"rope_type": "linear", "factor": 8.0, "rope_theta": 10000.0}, rope_scaling={"rope_type": "linear", "type": "linear", "factor": 8.0}), ["rope_parameters['rope_type'] is 'linear' in the config, 'yarn' from the record", "rope_parameters['factor'] is 8.0 in the config, 4.0 from the record", "rope_parameters['beta_fast'] is None in the config, 32.0 from the record"]),
    ("context", lambda config: config.update(max_position_embeddings=1024), ["max_position_embeddings is 1024 in the config, 256 from the record"]),
    # only transformers 5's key edited: transformers reads 4.x's rope_scaling over it, the file still says it
    ("factor in rope_parameters only", lambda config: config["rope_parameters"].update(factor=8.0), ["rope_parameters['factor'] is 8.0 in the config, 4.0 from the record"]),
    ("theta in rope_parameters only", lambda config: config["rope_parameters"].update(rope_theta=500000.0), ["rope_parameters['rope_theta'] is 500000.0 in the config, 10000.0 from the record"]),
    ("beta_fast in rope_scaling only", lambda config: config["rope_scaling"].update(beta_fast=16.0), ["rope_parameters['beta_fast'] is 16.0 in the config, 32.0 from the record"]),
]  # fmt: skip


@pytest.mark.parametrize(("case", "edit", "named"), EDITS, ids=[edit[0] for edit in EDITS])
def test_a_config_edited_against_its_record_loads_the_record_with_a_warning(saved, tmp_path, caplog, case, edit, named):
    """Someone edited config.json: hf_posenc applies its record (the model is the one saved) and says so."""
    ids, cases = saved
    entry = cases["yarn"]
    shutil.copytree(entry["dir"], tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config.json").read_text())
    edit(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING, logger="hf_posenc"):
        model = hf_posenc.from_pretrained(str(tmp_path), attn_implementation="eager").eval()
    [message] = [r.getMessage() for r in caplog.records if "disagrees" in r.getMessage()]
    assert message.startswith(f"hf_posenc: the config of {tmp_path} disagrees with its hf_posenc record (yarn:")
    assert all(text in message for text in named)
    assert message.endswith(
        "hf_posenc applies the record; plain transformers would build the model from the config's values."
    )
    assert hf_posenc.get_patch(model) == entry["info"]
    with torch.no_grad():
        assert torch.equal(model(ids).logits, entry["logits"])


@pytest.mark.parametrize("case", sorted(NATIVE_TYPES))
def test_native_configs_pass_transformers_validation_silently(saved, case, caplog):
    _, cases = saved
    transformers.logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING):
            config = AutoConfig.from_pretrained(cases[case]["dir"])
            config.validate_rope()
    finally:
        transformers.logging.disable_propagation()
    assert [r for r in caplog.records if "rope" in r.getMessage().lower()] == []


def test_the_record_recovers_the_base_config():
    model = make_tiny("llama")
    base = model.config.to_dict()
    hf_posenc.patch(model, "llama3", factor=8)
    assert model.config.max_position_embeddings == 512
    record = PatchRecord.from_config(model.config)
    split, method, params = record.base_config(model.config), record.method, record.params
    assert (method, params["factor"], params["original_max_position_embeddings"]) == ("llama3", 8.0, 64)
    assert split.to_dict() == base
    assert model.config.hf_posenc["method"] == "llama3"  # the model's own config is untouched


def test_loading_a_patched_config_without_from_pretrained_is_refused(saved):
    """transformers alone builds the native model, but hf_posenc cannot unpatch what it did not record."""
    _, cases = saved
    model = transformers.AutoModelForCausalLM.from_pretrained(cases["yarn"]["dir"])
    with pytest.raises(RuntimeError, match="hf_posenc.from_pretrained"):
        hf_posenc.patch(model, "pi", factor=2)


def test_from_pretrained_refuses_remote_code(saved):
    _, cases = saved
    with pytest.raises(ValueError, match="never loads remote code"):
        hf_posenc.from_pretrained(str(cases["yarn"]["dir"]), trust_remote_code=True)
