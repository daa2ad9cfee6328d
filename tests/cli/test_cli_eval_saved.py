"""Evaluate what you saved or pushed: ``--model`` a model saved after ``hf_posenc.patch``, or a config-only repo
``push`` made. ``none`` is its base; the saved method, asked for (the default), is the model as saved."""

from __future__ import annotations

import json
import math
import pickle
from copy import deepcopy

import pytest
import torch
from hub_server import BASE_REPO, upload_base
from huggingface_hub import HfApi
from tiny_models import make_tiny
from tiny_runs import results_of
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.hub.fingerprint import model_fingerprint
from hf_posenc.hub.saved import SavedPatch, load_base_model, restore_saved_tensors, saved_patch, saved_tensors
from hf_posenc.record import PatchRecord
from hf_posenc.spec import parse_method_spec

pytestmark = pytest.mark.xdist_group("cli-eval-saved")  # its module fixtures are built once, on one worker

ASKED = {"yarn": "yarn:factor=2", "dynamic-yarn": "dynamic-yarn", "alibi": "alibi"}  # the same on the base
SAVED = {
    "yarn": {"factor": 2.0, "original_max_position_embeddings": 64},
    "dynamic-yarn": {"original_max_position_embeddings": 64},
    "alibi": {},
}


def _save_patched(tiny_dir, folder, method: str):
    model = hf_posenc.patch(AutoModelForCausalLM.from_pretrained(tiny_dir / "model"), method, **SAVED[method])
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_dir / "model").save_pretrained(folder)


def _eval(model, data, output, *methods: str) -> dict[tuple[str, int], float]:
    argv = ["eval", "--model", str(model), "--dataset", str(data), "--output", str(output), "--lengths", "32,96"]
    assert main(argv + [arg for method in methods for arg in ("--method", method)]) == 0
    return {(r["method"], r["length"]): r["ppl"] for r in results_of(output)["results"]}


@pytest.fixture(scope="module")
def base_ppl(tiny_dir, tmp_path_factory):
    """Every method evaluated on the base model, once."""
    output = tmp_path_factory.mktemp("base")
    return _eval(tiny_dir / "model", tiny_dir / "texts", output, "none", *ASKED.values())


@pytest.mark.parametrize("method", list(SAVED))
def test_a_saved_patched_model_is_its_base_and_its_saved_method(tiny_dir, tmp_path, base_ppl, method):
    """A saved patched model loads (no ``KeyError: 'hf_posenc_alibi'``, no "already carries a patch") and is
    scored as its base and its saved method."""
    _save_patched(tiny_dir, tmp_path / "saved", method)
    ppl = _eval(tmp_path / "saved", tiny_dir / "texts", tmp_path / "out")  # default: none and the saved method
    report = results_of(tmp_path / "out")
    details = report["model_details"]
    assert details["saved_patch"].split(":")[0] == method and details["weights_from"] is None
    assert [r["method"] for r in report["results"]] == ["none", "none", details["saved_patch"], details["saved_patch"]]
    asked = ASKED[method]
    for n in (32, 96):
        assert ppl["none", n] == base_ppl["none", n]  # bit for bit: the base
        assert math.isclose(ppl[details["saved_patch"], n], base_ppl[asked, n], rel_tol=1e-9)  # as saved


def test_a_saved_patched_model_takes_other_methods_on_its_base(tiny_dir, tmp_path, base_ppl):
    _save_patched(tiny_dir, tmp_path / "saved", "alibi")
    ppl = _eval(tmp_path / "saved", tiny_dir / "texts", tmp_path / "out", "yarn:factor=2", "none")
    assert ppl == {key: value for key, value in base_ppl.items() if key[0] in ("none", "yarn:factor=2")}


def test_a_config_only_push_is_evaluated_on_the_base_weights_it_names(fake_hub, tiny_dir, tmp_path, base_ppl):
    upload_base()
    HfApi().upload_folder(
        repo_id=BASE_REPO, folder_path=str(tiny_dir / "model"), allow_patterns=["tokenizer*", "special*"]
    )
    base = AutoModelForCausalLM.from_pretrained(BASE_REPO)
    hf_posenc.push_to_hub(hf_posenc.patch(base, "yarn", **SAVED["yarn"]), "me/tiny-yarn")
    assert "tokenizer.json" not in fake_hub.files("me/tiny-yarn")  # config-only: weights and tokenizer stay

    ppl = _eval("me/tiny-yarn", tiny_dir / "texts", tmp_path / "out")
    from_base = _eval(BASE_REPO, tiny_dir / "texts", tmp_path / "base", "none", "yarn:factor=2")
    report = results_of(tmp_path / "out")
    saved = report["model_details"]["saved_patch"]
    assert report["model"] == "me/tiny-yarn" and report["model_details"]["weights_from"] == BASE_REPO
    for n in (32, 96):
        assert ppl["none", n] == from_base["none", n] and ppl[saved, n] == from_base["yarn:factor=2", n]

    card = tmp_path / "card.md"
    argv = ["card", "--model", "me/tiny-yarn", "--method", "yarn:factor=2", "--output", str(card)]
    assert main(argv + ["--results", str(tmp_path / "out" / "results.json"), "--repo", "me/again"]) == 0
    text = card.read_text()
    assert f"base_model: {BASE_REPO}" in text  # the weights' repo, not the config-only one
    assert f"Measured on `me/tiny-yarn`, a model saved with `{saved}`" in text
    metadata = json.loads(fake_hub.files("me/tiny-yarn")["hf_posenc.json"])
    assert metadata["base_revision"] in text
    assert report["model_details"]["commit"] == metadata["base_revision"]  # of the weights, not the config's repo
    push = ["push", "--model", "me/tiny-yarn", "--method", "pi:factor=2", "--repo", "me/tiny-pi"]
    assert main(push) == 0
    pushed = json.loads(fake_hub.files("me/tiny-pi")["hf_posenc.json"])
    assert (pushed["base_model"], pushed["base_revision"]) == (BASE_REPO, metadata["base_revision"])
    loaded = hf_posenc.from_pretrained("me/tiny-pi")
    assert hf_posenc.get_patch(loaded).method == "pi"  # pi on the base, not on the saved yarn


def test_passkey_on_a_saved_model_runs_its_base_and_its_saved_method(tiny_dir, tmp_path):
    _save_patched(tiny_dir, tmp_path / "saved", "alibi")
    out = tmp_path / "pk"
    assert main(["passkey", "--model", str(tmp_path / "saved"), "--lengths", "400", "--output", str(out)]) == 0
    report = json.loads((out / "passkey.json").read_text())
    saved = report["model_details"]["saved_patch"]
    assert saved == "alibi"  # the paper's slopes, which patch fills in for the model; the backend is auto
    assert [t["method"] for t in report["trials"]][:: len(report["trials"]) // 2] == ["none", saved]


def test_a_saved_t5_bias_model_is_evaluated_with_its_trained_table(tiny_dir, tmp_path):
    """The saved method re-applied to the base would start from a fresh table; the run gives it the saved one,
    so its perplexity is the saved model's own (its forward loaded through hf_posenc.from_pretrained)."""
    model = hf_posenc.patch(AutoModelForCausalLM.from_pretrained(tiny_dir / "model"), "t5-bias", backend="eager")
    with torch.no_grad():  # "trained": not the initial table
        model.model.position_bias.weight.add_(torch.randn(32, 4, generator=torch.Generator().manual_seed(0)))
    model.save_pretrained(tmp_path / "saved")
    AutoTokenizer.from_pretrained(tiny_dir / "model").save_pretrained(tmp_path / "saved")
    ppl = _eval(tmp_path / "saved", tiny_dir / "texts", tmp_path / "out", "t5-bias:backend=eager", "t5-bias:init=zeros")
    loaded = hf_posenc.from_pretrained(str(tmp_path / "saved")).eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "saved")
    texts = [path.read_text() for path in sorted((tiny_dir / "texts").iterdir())]
    windows = [torch.tensor([ids[:96]]) for ids in tokenizer(texts)["input_ids"] if len(ids) >= 96]  # no BOS
    with torch.no_grad():
        nll = sum(loaded(ids, labels=ids).loss.item() * 95 for ids in windows)  # truncate: 95 scored a window
    row = [r for r in results_of(tmp_path / "out")["results"] if r["method"] == "t5-bias:backend=eager"]
    n96 = next(r for r in row if r["length"] == 96)
    assert n96["windows"] == len(windows) == 2 and math.isclose(n96["ppl"], math.exp(nll / 190), rel_tol=1e-4)
    assert ppl["t5-bias:init=zeros", 96] != ppl["t5-bias:backend=eager", 96]  # another patch: a fresh table


def test_a_copy_of_a_loaded_saved_t5_model_keeps_its_trained_table(tiny_dir, tmp_path):
    """The trained table a saved t5-bias model's base keeps aside (to give the saved method back) goes with a deepcopy
    or a pickle of it, and so does its fingerprint."""
    model = hf_posenc.patch(AutoModelForCausalLM.from_pretrained(tiny_dir / "model"), "t5-bias", backend="eager")
    with torch.no_grad():
        model.model.position_bias.weight.add_(1.0)
    model.save_pretrained(tmp_path / "saved")
    saved = saved_patch(str(tmp_path / "saved"))
    base = load_base_model(str(tmp_path / "saved"), saved)
    trained = saved_tensors(base)
    assert list(trained) == ["model.position_bias.weight"]
    for copy in (deepcopy(base), pickle.loads(pickle.dumps(base))):
        assert model_fingerprint(copy) == model_fingerprint(base)
        assert torch.equal(saved_tensors(copy)["model.position_bias.weight"], trained["model.position_bias.weight"])
        hf_posenc.patch(copy, "t5-bias", backend="eager")
        assert restore_saved_tensors(copy)
        assert torch.equal(copy.model.position_bias.weight, model.model.position_bias.weight)


def test_a_saved_gpt2_pi_is_the_model_as_saved(tiny_dir, tmp_path):
    """GPT-2 ``pi`` is baked (the resampled table is in the weights, the original gone): the model as saved is
    the base, ``none`` by default is that model, and the results name the saved patch. The saved method is not
    applied again by default: it would be refused (a 128-row table is no 64-row one)."""
    gpt2 = AutoModelForCausalLM.from_pretrained(tiny_dir / "gpt2")
    hf_posenc.patch(gpt2, "pi", factor=2).save_pretrained(tmp_path / "saved")
    AutoTokenizer.from_pretrained(tiny_dir / "model").save_pretrained(tmp_path / "saved")
    ppl = _eval(tmp_path / "saved", tiny_dir / "texts", tmp_path / "out")
    details = results_of(tmp_path / "out")["model_details"]
    assert details["saved_patch"] == "pi:factor=2.0,original_max_position_embeddings=64"
    direct = _eval(tiny_dir / "gpt2", tiny_dir / "texts", tmp_path / "direct", "pi:factor=2")
    assert ppl == {("none", n): direct["pi:factor=2", n] for n in (32, 96)}


def test_the_card_of_a_local_saved_model_names_no_local_folder_and_claims_no_training(tiny_dir, tmp_path):
    """A card says a local model by its folder's last part (as the pushed eval_results.json does), and says
    "without any training" only of a config-only repo (the base's weights): weights pushed may have been trained."""
    _save_patched(tiny_dir, tmp_path / "saved", "yarn")
    _eval(tmp_path / "saved", tiny_dir / "texts", tmp_path / "out")
    card = tmp_path / "card.md"
    argv = ["card", "--model", str(tmp_path / "saved"), "--method", "yarn:factor=2", "--with-weights"]
    assert main([*argv, "--results", str(tmp_path / "out" / "results.json"), "--output", str(card)]) == 0
    text = card.read_text()
    assert "Measured on `saved`, a model saved with" in text and str(tmp_path) not in text
    assert "by `hf_posenc`." in text and "without any training" not in text


@pytest.mark.parametrize(
    ("folder", "method", "title"),
    [
        ("tiny-yarn2", "yarn:factor=2", "tiny-yarn2"),
        ("saved", "yarn:factor=2", "saved-yarn"),
        ("tiny-yarn2", "pi:factor=2", "tiny-yarn2-pi"),
    ],
)
def test_a_cards_default_name_names_the_method_once(tiny_dir, tmp_path, folder, method, title):
    """Without ``--repo`` a card is named ``<model>-<method>``, but a folder saved with the method whose name says
    it already keeps its name (no ``tiny-yarn2-yarn``)."""
    _save_patched(tiny_dir, tmp_path / folder, "yarn")
    card = tmp_path / "card.md"
    assert (
        main(["card", "--model", str(tmp_path / folder), "--method", method, "--with-weights", "--output", str(card)])
        == 0
    )
    assert card.read_text().split("\n---\n", 1)[1].lstrip().startswith(f"# {title}\n")


@pytest.mark.parametrize(
    ("name", "method", "named"),
    [
        ("smol-yarn4", "yarn", True),
        ("smol_yarn-x4", "yarn", True),
        ("Qwen2.5-0.5B-YaRN4.0", "yarn", True),
        ("yarn", "yarn", True),
        ("smol-yarnless", "yarn", False),
        ("smol-dynamic-yarn", "yarn", False),  # names dynamic-yarn
        ("smol-dynamic-yarn", "dynamic-yarn", True),
        ("gpt2-pile", "pi", False),
        ("tiny-pixel", "pi", False),
        ("gpt2-pi2", "pi", True),
        ("smol-yarn4x", "yarn", True),
        ("llama-yarn128k", "yarn", True),
        ("smol-yarn4xl", "yarn", False),
        ("llama-ntk-by-parts", "ntk", False),
    ],
)
def test_a_name_names_a_method_as_a_word_of_its_own(name, method, named):
    """A word names a method only as a word of its own, not by starting with the method's name (``gpt2-pile`` would
    name pi, ``smol-dynamic-yarn`` yarn, and the card keep the name)."""
    from hf_posenc.cli.share import _names_method

    assert _names_method(name, method) is named


@pytest.mark.parametrize(
    ("params", "spec"),
    [
        ({"factor": 4}, "yarn:original_max_position_embeddings=64,factor=4.0"),
        (
            {"factor": 4, "attention_factor": 1.3},
            "yarn:original_max_position_embeddings=64,factor=4.0,attention_factor=1.3",
        ),
    ],
)
def test_the_saved_methods_name_leaves_out_what_its_resolution_derives(params, spec):
    """YaRN's attention factor 0.1 ln s + 1 is the factor's: the name (the results' row) left it in, unlike the
    README's example; one given otherwise stays, and the name patches the same model again."""
    record = PatchRecord.from_config(hf_posenc.patch(make_tiny("llama"), "yarn", **params).config)
    assert SavedPatch(record).spec == spec
    name, parsed = parse_method_spec(spec)
    assert PatchRecord.from_config(hf_posenc.patch(make_tiny("llama"), name, **parsed).config).params == record.params


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_saved_alibis_name_leaves_out_the_paper_slopes_patch_filled_in(family):
    """ALiBi records the slopes it used; the paper's for the model's heads are what `patch` fills in, so the name is
    plain `alibi` (with every slope spelled out, `--method alibi` beside it would be refused as the same method).
    Other slopes stay in the name, which patches the same model again."""
    heads = make_tiny(family).config.num_attention_heads
    record = PatchRecord.from_config(hf_posenc.patch(make_tiny(family), "alibi").config)
    assert record.params["slopes"] is not None and SavedPatch(record).spec == "alibi"
    slopes = [0.5] * heads
    record = PatchRecord.from_config(hf_posenc.patch(make_tiny(family), "alibi", slopes=slopes).config)
    spec = SavedPatch(record).spec
    assert spec == f"alibi:slopes={slopes}"
    name, parsed = parse_method_spec(spec)
    assert PatchRecord.from_config(hf_posenc.patch(make_tiny(family), name, **parsed).config).params == record.params
