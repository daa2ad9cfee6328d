"""A saved patched model read by transformers 4.x (the last release, in a separate ``pip install --target``, run in a
subprocess without hf_posenc): native methods build the patched model exactly, the others are refused.

transformers 4.x reads ``rope_scaling`` and a top-level ``rope_theta``; from a file with only transformers 5's
``rope_parameters`` it builds an unscaled model with ``rope_theta`` 10000 without a word. The patch writes both
(:mod:`hf_posenc.patching.legacy`).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import method_params, pip_target
from tiny_models import TINY, make_tiny
from transformers import AutoConfig, AutoModelForCausalLM, GPTNeoXConfig, OlmoConfig, Phi3Config

import hf_posenc

pytestmark = pytest.mark.xdist_group("transformers4")  # its module fixtures are built once, on one worker

VERSION = "4.57.6"  # the last 4.x release
READER = Path(__file__).resolve().parents[1] / "legacy_reader.py"
IDS = [[(7 * i + 3) % 97 for i in range(90)]]  # past the tiny models' 64 positions: scaling, long factors, growth

ROPE_METHODS = [
    "pi",
    "ntk",
    "dynamic-ntk",
    "yarn",
    "ntk-by-parts",
    "llama3",
    "longrope",  # native
    "dynamic-yarn",
    "alibi",
    "nope",
    "t5-bias",
    "self-extend",
    "dca",
    "string",
    "rerope",
    "leaky-rerope",
    "logn",
    "yarn+logn",
]
CASES = [(family, method) for family in ("llama", "qwen2") for method in ROPE_METHODS] + [
    ("gpt2", method) for method in ("pi", "alibi", "nope", "sinusoidal", "t5-bias")
]
# GPT-NeoX's 4.x class reads rotary_emb_base / rotary_pct, not rope_theta / partial_rotary_factor: a base and a
# rotary fraction other than its defaults (10000, 0.25) show whether the file says them in its keys.
CASES += [("gpt_neox", method) for method in ("pi", "ntk", "dynamic-ntk", "yarn", "llama3", "dynamic-yarn")]
LONG = {"factor": 4, "long_factor": [1.0 + i / 4 for i in range(8)]}
# Families whose 4.x config class takes a fixed set of rope_scaling fields (legacy.FIXED_FIELDS): label -> (method,
# parameters, what 4.x does). Their tiny models' logits differ between 5.x and 4.57.6 unpatched already (the two
# releases build these families differently), so their rotary cos / sin are compared: what the config says.
FIXED = {
    ("phi3", "ntk"): ("ntk", {"factor": 4}, "same"),
    ("phi3", "longrope"): ("longrope", LONG, "ValueError"),  # its class takes 3 fields only, the patch says more
    ("olmo", "pi"): ("pi", {"factor": 4}, "same"),
    ("olmo", "dynamic-ntk"): ("dynamic-ntk", {"factor": 4}, "same"),
    ("olmo", "yarn"): ("yarn", {"factor": 4}, "ValueError"),  # OLMo's 4.x class takes linear and dynamic only
}


def _patched(family: str, method: str) -> torch.nn.Module:
    if (family, method) in FIXED:
        name, params, _ = FIXED[(family, method)]
        config_class = {"phi3": Phi3Config, "olmo": OlmoConfig}[family]
        torch.manual_seed(0)
        trained = {"original_max_position_embeddings": 64} if family == "phi3" else {}  # Phi-3's own key, top level
        config = config_class(**copy.deepcopy(TINY), **trained, pad_token_id=0, eos_token_id=0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
        return hf_posenc.patch(model, name, original_max_position_embeddings=64, **params)
    if family == "gpt_neox":
        torch.manual_seed(0)
        rope = {"rope_type": "default", "rope_theta": 1e5, "partial_rotary_factor": 0.5}
        sizes = {key: TINY[key] for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")}
        config = GPTNeoXConfig(**sizes, num_attention_heads=4, max_position_embeddings=64, rope_parameters=rope)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
        return hf_posenc.patch(model, method, original_max_position_embeddings=64, **method_params(method, pairs=4))
    overrides = {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}} if family == "qwen2" else {}
    model = make_tiny(family, **overrides)
    params = {"factor": 4} if "+" in method else method_params(method, pairs=8)
    return hf_posenc.patch(model, method, **params)


def _cos_sin(model) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary module's cos and sin at positions 0 .. len(IDS) - 1."""
    return model.base_model.rotary_emb(torch.zeros(1), torch.arange(len(IDS[0]))[None])


@pytest.fixture(scope="session")
def saved(tmp_path_factory):
    """Each case patched and saved: case -> (folder, patched model, its logits on IDS). Once a session: the worker
    that runs this module's tests may take them in more than one batch."""
    root = tmp_path_factory.mktemp("saved4")
    models = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: intra-op threads only spin-wait
    try:
        for family, method in [*CASES, *FIXED]:
            model = _patched(family, method)
            folder = root / f"{family}-{method}"
            model.save_pretrained(folder)
            with torch.no_grad():
                models[(family, method)] = (str(folder), model, model(torch.tensor(IDS)).logits)
    finally:
        torch.set_num_threads(threads)
    return models


@pytest.fixture(scope="session")
def read_by_4x(saved, tmp_path_factory):
    """What transformers 4.x makes of every saved folder: its logits or its error, by case."""
    target = pip_target(f"transformers=={VERSION}")
    work = tmp_path_factory.mktemp("reader4")
    (work / "request.json").write_text(json.dumps({"folders": [f for f, _, _ in saved.values()], "ids": IDS}))
    env = {**os.environ, "PYTHONPATH": str(target), "HF_HUB_OFFLINE": "1", "PYTHONNOUSERSITE": "1"}
    done = subprocess.run(
        [sys.executable, str(READER), str(work / "request.json"), str(work / "result.json")],
        capture_output=True,
        text=True,
        env=env,
        cwd=work,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((work / "result.json").read_text())
    assert result["transformers"] == VERSION
    return {case: result["results"][folder] for case, (folder, _, _) in saved.items()}


def test_every_case_is_read(saved, read_by_4x):
    """The cases cover every registered method on a RoPE decoder (and the table above is not out of date)."""
    singles = {method for family, method in CASES if family == "llama" and "+" not in method}
    rope_methods = {m for m in hf_posenc.available_methods() if m != "sinusoidal"}
    assert singles == rope_methods
    assert set(read_by_4x) == set(saved)


@pytest.mark.parametrize("family,method", CASES)
def test_native_methods_load_exactly_and_the_others_are_refused(saved, read_by_4x, family, method):
    _, model, logits = saved[(family, method)]
    read = read_by_4x[(family, method)]
    if hf_posenc.get_patch(model).native:
        assert "logits" in read, read.get("refused")
        torch.testing.assert_close(torch.tensor(read["logits"]), logits, rtol=1e-5, atol=1e-6)
        if family != "gpt2":  # Qwen2's base 1e6 (or static NTK's larger one), not 4.x's default 10000
            assert read["rope_theta"] == model.config.rope_parameters["rope_theta"]
    else:  # never a model with the original encoding: transformers 4.x has no rope type / activation of that name
        assert read.get("refused", "").startswith("KeyError: 'hf_posenc"), read.get("refused") or "loaded"


@pytest.mark.parametrize("case", sorted(FIXED))
def test_a_4x_class_with_fixed_rope_scaling_fields_gets_them_or_refuses(saved, read_by_4x, case):
    """OLMo's 4.x class takes exactly type and factor, Phi-3's type, short_factor and long_factor: given the fields
    that say the method, 4.57.6 builds the patched rotary embedding; where they cannot, it refuses the config."""
    _, model, _ = saved[case]
    read, expected = read_by_4x[case], FIXED[case][2]
    if expected == "same":
        assert "cos" in read, read.get("refused")
        with torch.no_grad():
            cos, sin = _cos_sin(model)
        torch.testing.assert_close(torch.tensor(read["cos"]), cos, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(torch.tensor(read["sin"]), sin, rtol=1e-5, atol=1e-6)
    else:
        assert read.get("refused", "").startswith(f"{expected}: `rope_scaling`"), read.get("refused") or "loaded"


@pytest.mark.parametrize("method", ["yarn", "longrope", "ntk", "dynamic-yarn"])
def test_transformers5_reads_the_file_with_the_legacy_keys_as_the_patched_model(saved, method):
    """transformers 5 takes ``rope_scaling`` as its ``rope_parameters`` when both are there: the same ones (plus the
    ``type`` 4.x needs), the same logits; ``hf_posenc.from_pretrained`` rebuilds the patched config exactly, its base
    without any of the 4.x keys."""
    folder, model, logits = saved[("qwen2", method)]
    config = AutoConfig.from_pretrained(folder)
    rope = {k: v for k, v in config.rope_parameters.items() if k != "type"}
    assert rope == model.config.rope_parameters
    if hf_posenc.get_patch(model).native:
        plain = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
        with torch.no_grad():
            assert torch.equal(plain(torch.tensor(IDS)).logits, logits)
    loaded = hf_posenc.from_pretrained(folder, attn_implementation="eager").eval()
    assert _settings(loaded) == _settings(model)
    hf_posenc.unpatch(loaded)
    assert _settings(loaded) == _settings(
        make_tiny("qwen2", rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    )


def _settings(model) -> dict:
    """The config as a dict, without what saving and loading add (where from, class, dtype, version)."""
    added = ("_name_or_path", "architectures", "dtype", "transformers_version")
    return {k: v for k, v in model.config.to_dict().items() if k not in added}


def test_unpatch_removes_the_legacy_keys(tiny_model):
    before = tiny_model.config.to_dict()
    hf_posenc.patch(tiny_model, "yarn", factor=4)
    written, rope = tiny_model.config.to_dict(), tiny_model.config.rope_parameters
    assert written["rope_scaling"] == {**{k: v for k, v in rope.items() if k != "rope_theta"}, "type": "yarn"}
    assert written["rope_theta"] == rope["rope_theta"]
    assert tiny_model.config.rope_scaling is tiny_model.config.rope_parameters  # transformers' alias untouched
    hf_posenc.unpatch(tiny_model)
    assert tiny_model.config.to_dict() == before


@pytest.mark.parametrize(
    "rope,expected",
    [
        ({"rope_type": "default", "rope_theta": 5e5}, {"rope_scaling": None, "rope_theta": 5e5}),
        (
            {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4, "partial_rotary_factor": 0.5},
            {
                "rope_scaling": {"rope_type": "linear", "type": "linear", "factor": 2.0},
                "rope_theta": 1e4,
                "partial_rotary_factor": 0.5,
            },
        ),
        (
            {
                "rope_type": "longrope",
                "rope_theta": 1e4,
                "original_max_position_embeddings": 4096,
                "factor": 32.0,
                "long_factor": [2.0],
                "short_factor": [1.0],
            },
            {
                "rope_scaling": {
                    "rope_type": "longrope",
                    "type": "longrope",
                    "original_max_position_embeddings": 4096,
                    "factor": 32.0,
                    "long_factor": [2.0],
                    "short_factor": [1.0],
                },
                "rope_theta": 1e4,
                "original_max_position_embeddings": 4096,
            },
        ),
        ({"full_attention": {"rope_type": "default", "rope_theta": 1e4}}, {}),  # per layer type: 4.x has no key
    ],
)
def test_legacy_keys(rope, expected):
    from hf_posenc.patching.legacy import legacy_rope_keys

    assert legacy_rope_keys(rope) == expected


def test_legacy_keys_in_the_fields_a_4x_class_takes():
    from hf_posenc.patching.legacy import legacy_rope_keys

    linear = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}
    assert legacy_rope_keys(linear, "olmo")["rope_scaling"] == {"type": "linear", "factor": 2.0}
    assert legacy_rope_keys(linear, "llama")["rope_scaling"] == {"rope_type": "linear", "type": "linear", "factor": 2.0}
    yarn = {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4, "original_max_position_embeddings": 64}
    assert legacy_rope_keys(yarn, "olmo") == legacy_rope_keys(yarn)  # no fields of OLMo's say it: refused there


def test_a_saved_dynamic_yarn_loads_with_plain_transformers_after_import(tmp_path):
    """``import hf_posenc`` then plain ``from_pretrained``: transformers builds the model on the meta device first,
    where hf_posenc's rope init has no values to check (and does not raise); the model then equals the patched
    one, inside the trained context and on a first call past it."""
    model = _patched("qwen2", "dynamic-yarn")
    model.save_pretrained(tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    for length in (40, 90):
        ids = torch.tensor(IDS)[:, :length]
        with torch.no_grad():
            torch.testing.assert_close(plain(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


def test_a_base_loaded_from_a_4x_config_reloads_patched_without_a_false_warning(tmp_path, caplog):
    """A base whose config.json has only 4.x keys keeps their ``type`` in ``rope_parameters`` under transformers 5;
    patched with ALiBi, saved and reloaded, nothing was edited: no 'disagrees' warning."""
    base = make_tiny("qwen2")
    base.save_pretrained(tmp_path / "base")
    config = json.loads((tmp_path / "base" / "config.json").read_text())
    del config["rope_parameters"]
    config.update(rope_theta=1e6, rope_scaling={"type": "linear", "factor": 2.0}, max_position_embeddings=128)
    (tmp_path / "base" / "config.json").write_text(json.dumps(config))
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "base", attn_implementation="eager")
    assert model.config.rope_parameters.get("type") == "linear"  # what transformers 5 keeps of the 4.x file
    hf_posenc.patch(model, "alibi")
    model.save_pretrained(tmp_path / "alibi")
    with caplog.at_level(logging.WARNING, logger="hf_posenc"):
        hf_posenc.from_pretrained(tmp_path / "alibi", attn_implementation="eager")
    assert not [r for r in caplog.records if "disagrees" in r.getMessage()]
