"""The commit of the base a push with weights records (``base_revision``): the commit the model object's weights were
loaded at, which transformers does not keep, told from the cache and the weights themselves, or none."""

from __future__ import annotations

import json
import logging
import re

import pytest
import torch
from helpers import BASE_PPL, YARN_PPL, write_results
from hub_server import BASE_REPO, TOKEN, upload_base
from huggingface_hub import HfApi
from safetensors.torch import load_file, save_file
from tiny_models import make_tiny
from transformers import AutoModelForCausalLM

import hf_posenc
from hf_posenc.hub import push as hub
from hf_posenc.hub.provenance import weights_commit


def patched(model):
    return hf_posenc.patch(model.eval(), "yarn", factor=4, original_max_position_embeddings=64)


def measured_at(tmp_path, **model_details):
    """Eval results of yarn:factor=4 on BASE_REPO whose model_details say ``model_details`` (commit, revision)."""
    details = {"name": BASE_REPO, "dtype": "float32", **model_details}
    return write_results(tmp_path, {"yarn:factor=4": YARN_PPL, "none": BASE_PPL}, model_details=details)


def base_revision(fake_hub, repo_id: str) -> str | None:
    return json.loads(fake_hub.files(repo_id)["hf_posenc.json"])["base_revision"]


def test_a_push_with_weights_records_the_commit_they_were_loaded_at_not_main_now(fake_hub, tmp_path):
    """main moved after the load: the weights pushed are still the first commit's, and results measured there are
    theirs (main's commit now, recorded instead, would refuse those results)."""
    first = upload_base()
    model = patched(AutoModelForCausalLM.from_pretrained(BASE_REPO))
    second = upload_base(seed=1)
    assert weights_commit(model, BASE_REPO, None) == first
    hub.push_to_hub(model, "me/first", with_weights=True, eval_results=measured_at(tmp_path, commit=first))
    assert base_revision(fake_hub, "me/first") == first
    with pytest.raises(ValueError, match=f"measured on revision {second} .* come from its commit {first} \\('main'\\)"):
        hub.push_to_hub(model, "me/second", with_weights=True, eval_results=measured_at(tmp_path, commit=second))
    older = measured_at(tmp_path, revision="main")  # a file naming main only: main's commit now, not the one pushed
    with pytest.raises(ValueError, match=re.escape(f"revision 'main' (now commit {second})")):
        hub.build_card(model, "me/x", with_weights=True, eval_results=older)
    assert "me/second" not in fake_hub.repos


def test_weights_whose_commit_cannot_be_told_record_none_and_their_results_are_not_compared(fake_hub, tmp_path, caplog):
    """Loaded at the first commit while the cache's main is the second: the weights are not the cache's, so no commit
    is recorded (main's now would quote its results for other weights) and results are let through
    with a warning; a commit given as `base_revision` is the caller's word, and compared."""
    first, second = upload_base(), upload_base(seed=1)
    AutoModelForCausalLM.from_pretrained(BASE_REPO)  # the cache's main: the second commit
    model = patched(AutoModelForCausalLM.from_pretrained(BASE_REPO, revision=first))
    assert weights_commit(model, BASE_REPO, None) is None and weights_commit(model, BASE_REPO, "main") is None
    of_second = measured_at(tmp_path, commit=second)
    with caplog.at_level(logging.WARNING, logger="hf_posenc"):
        hub.push_to_hub(model, "me/x", with_weights=True, eval_results=of_second)
    assert base_revision(fake_hub, "me/x") is None
    assert "The commit of 'org/tiny-base' the weights pushed come from cannot be told" in caplog.text
    assert f"whether the results {of_second} were measured on them cannot be told" in caplog.text
    with pytest.raises(ValueError, match=f"measured on revision {second} .* come from its commit {first}"):
        hub.build_card(model, "me/y", with_weights=True, eval_results=of_second, base_revision=first)
    hub.push_to_hub(model, "me/y", with_weights=True, base_revision=first)
    assert base_revision(fake_hub, "me/y") == first


def test_a_checkpoint_of_the_base_model_without_its_prefix_still_tells_the_commit(fake_hub, tmp_path):
    """GPT-2's own checkpoints (openai-community/gpt2, distilgpt2) store ``wte.weight``, not the model's
    ``transformer.wte.weight``: the names are matched through ``base_model_prefix`` (unmatched, nothing would be
    compared, and no commit recorded)."""
    folder = tmp_path / "gpt2"
    make_tiny("gpt2").save_pretrained(folder)
    tensors = load_file(folder / "model.safetensors")
    bare = {name.removeprefix("transformer."): tensor for name, tensor in tensors.items()}
    assert set(bare) != set(tensors)
    save_file(bare, folder / "model.safetensors", metadata={"format": "pt"})
    api = HfApi(token=TOKEN)
    api.create_repo("org/tiny-gpt2")
    commit = api.upload_folder(repo_id="org/tiny-gpt2", folder_path=folder).oid
    model = AutoModelForCausalLM.from_pretrained("org/tiny-gpt2")
    assert torch.equal(model.transformer.wte.weight, tensors["transformer.wte.weight"])  # it loads the same weights
    assert weights_commit(model, "org/tiny-gpt2", None) == commit
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.weight[0, 0] += 1  # another first row: not these weights
    assert weights_commit(model, "org/tiny-gpt2", None) is None


def test_weights_offloaded_by_a_device_map_still_tell_the_commit(fake_hub, tmp_path):
    """A model whose weights a device_map put on disk (or the CPU beside it) holds meta tensors, their values in
    accelerate's hooks: those are compared, so a model offloaded whole records its commit too."""
    first = upload_base()
    for budget in ("1KB", "60KB"):  # all on disk; some on the CPU
        loaded = AutoModelForCausalLM.from_pretrained(
            BASE_REPO, device_map="auto", max_memory={"cpu": budget}, offload_folder=tmp_path / budget
        )
        assert any(parameter.is_meta for parameter in loaded.parameters()), budget
        assert weights_commit(patched(loaded), BASE_REPO, None) == first, budget
    upload_base(seed=1)
    AutoModelForCausalLM.from_pretrained(BASE_REPO)  # the cache's main moves to other weights
    assert weights_commit(loaded, BASE_REPO, None) is None
