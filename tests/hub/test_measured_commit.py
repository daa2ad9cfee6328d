"""The Hub commit a results file records (``model_details.commit``) and what a push makes of it, against the fake Hub."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile

import torch
from hub_server import BASE_REPO, TOKEN, upload_base
from huggingface_hub import HfApi
from tiny_models import make_tiny
from transformers import AutoModelForCausalLM

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.eval.harness import _load
from hf_posenc.eval.models import ModelSource
from hf_posenc.hub import push as hub


def upload_with_tokenizer(tiny_dir, seed: int) -> str:
    """A tiny Llama of ``seed`` with the tiny tokenizer as BASE_REPO's new commit on main; returns the commit."""
    api = HfApi(token=TOKEN)
    api.create_repo(BASE_REPO, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        make_tiny("llama", seed=seed, max_position_embeddings=64).save_pretrained(folder)
        for path in (tiny_dir / "model").iterdir():
            if path.name.startswith(("tokenizer", "special")):
                shutil.copy(path, folder)
        return api.upload_folder(repo_id=BASE_REPO, folder_path=folder).oid


def run(capsys, *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_a_push_compares_the_commit_eval_loaded_not_the_branch_it_asked(fake_hub, tiny_dir, tmp_path, capsys):
    """eval of main records the commit main was; once main moves to other weights, a config-only push of main refuses
    those results, and a push of the commit measured takes them. A file that records no commit (made by hand or by
    another program) resumes, and gets this run's."""
    first = upload_with_tokenizer(tiny_dir, seed=0)
    output = tmp_path / "run"
    evaluate = ["eval", "--model", BASE_REPO, "--dataset", str(tiny_dir / "texts"), "--output", str(output)]
    evaluate += ["--method", "none", "--method", "yarn:factor=4"]
    assert run(capsys, *evaluate, "--lengths", "32")[0] == 0
    results = output / "results.json"
    earlier = json.loads(results.read_text())
    assert earlier["model_details"]["commit"] == first and "revision" not in earlier["model_details"]
    del earlier["model_details"]["commit"]
    results.write_text(json.dumps(earlier))
    assert run(capsys, *evaluate, "--lengths", "32,48")[0] == 0
    assert json.loads(results.read_text())["model_details"]["commit"] == first

    second = upload_with_tokenizer(tiny_dir, seed=1)  # main now holds other weights
    push = ["push", "--model", BASE_REPO, "--method", "yarn:factor=4", "--results", str(results)]
    code, err = run(capsys, *push, "--repo", "me/main")
    assert code == 2 and f"measured on revision {first} of 'org/tiny-base'" in err, err
    assert f"come from its commit {second} ('main')" in err and "me/main" not in fake_hub.repos
    code, err = run(capsys, *push, "--repo", "me/first", "--model-revision", first)
    assert code == 0, err
    assert json.loads(fake_hub.files("me/first")["hf_posenc.json"])["base_revision"] == first


def test_lm_eval_records_the_commit_of_a_named_model_and_none_of_a_model_object(fake_hub, tmp_path, caplog):
    """A model object's revision is not known: its results go with a push of any commit, with a warning, not read as
    main (a push of the revision measured refused, one of main's other weights taken)."""
    first = upload_base()
    HfApi(token=TOKEN).create_branch(BASE_REPO, branch="v1", revision=first)
    second = upload_base(seed=1)
    named = _load(ModelSource(BASE_REPO, dtype="float32"), None, None, "tokenizer", torch.device("cpu"))
    assert named.details["commit"] == second
    model = AutoModelForCausalLM.from_pretrained(BASE_REPO, revision="v1")
    details = _load(None, None, model, None, torch.device("cpu")).details
    assert details["revision"] is None and details["commit"] is None
    patched = hf_posenc.patch(model, "yarn", factor=4, original_max_position_embeddings=64)
    params = dict(hf_posenc.get_patch(patched).params)
    runs = [{"method": "none", "params": {}, "results": {"t": {"acc,none": 0.5}}}]
    runs.append({"method": "yarn:factor=4", "params": params, "results": {"t": {"acc,none": 0.25}}})
    report = {"model": BASE_REPO, "lm_eval_version": "0.4.13", "max_length": 64, "model_details": details}
    path = tmp_path / "lm_eval.json"
    path.write_text(json.dumps({**report, "runs": runs}))
    with caplog.at_level(logging.WARNING, logger="hf_posenc"):
        hub.build_card(patched, "me/x", lm_eval_results=path, base_revision="v1")
        hub.build_card(patched, "me/x", lm_eval_results=path)
    assert caplog.text.count(f"{path} record no revision of 'org/tiny-base'") == 2


def test_card_with_weights_compares_the_fingerprint_as_push_does(fake_hub, tiny_dir, tmp_path, capsys):
    """main moved to a commit of the same weights: a push of them takes the results (same fingerprint), and so does
    their card (``build_card`` and ``card --with-weights``); a config-only card compares the commit, and refuses."""
    first = upload_with_tokenizer(tiny_dir, seed=0)
    output = tmp_path / "run"
    evaluate = ["eval", "--model", BASE_REPO, "--dataset", str(tiny_dir / "texts"), "--output", str(output)]
    assert run(capsys, *evaluate, "--method", "none", "--method", "yarn:factor=4", "--lengths", "32")[0] == 0
    api = HfApi(token=TOKEN)
    assert api.upload_file(path_or_fileobj=b"# moved\n", path_in_repo="README.md", repo_id=BASE_REPO).oid != first
    results = str(output / "results.json")
    base = AutoModelForCausalLM.from_pretrained(BASE_REPO).eval()
    fingerprint = json.loads((output / "results.json").read_text())["model_details"]["fingerprint"]
    model = hf_posenc.patch(base, "yarn", factor=4)
    hub.build_card(model, "me/x", eval_results=results, with_weights=True, weights_fingerprint=fingerprint)
    card = ["card", "--model", BASE_REPO, "--method", "yarn:factor=4", "--results", results, "--repo", "me/x"]
    code, err = run(capsys, *card, "--with-weights", "--output", str(tmp_path / "card.md"))
    assert code == 0, err
    code, err = run(capsys, *card)
    assert code == 2 and f"measured on revision {first} of 'org/tiny-base'" in err, err
    push = ["push", "--model", BASE_REPO, "--method", "yarn:factor=4", "--results", results, "--with-weights"]
    assert run(capsys, *push, "--repo", "me/x")[0] == 0
    assert fake_hub.files("me/x")["README.md"] == (tmp_path / "card.md").read_bytes()
