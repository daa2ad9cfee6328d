"""push_to_hub / from_pretrained through huggingface_hub's real client, against a local fake Hub."""

from __future__ import annotations

import json
import logging
import math
import re
import tempfile
import traceback
from pathlib import Path

import pytest
import torch
from helpers import BASE_PPL, YARN_PPL, write_results
from hub_server import BASE_REPO, TOKEN, upload_base
from huggingface_hub import HfApi, ModelCard, hf_hub_download
from huggingface_hub.errors import HfHubHTTPError
from tiny_models import make_tiny
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import hf_posenc
from hf_posenc.hub import push as hub
from hf_posenc.hub.errors import refuse_missing_folder
from hf_posenc.hub.fingerprint import model_fingerprint
from hf_posenc.hub.saved import saved_patch

IDS = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79] * 6])  # (1, 96) > L = 64


def load_base_patched(method: str = "yarn", **params):
    model = AutoModelForCausalLM.from_pretrained(BASE_REPO).eval()
    return hf_posenc.patch(model, method, original_max_position_embeddings=64, **params)


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


def snapshot(model) -> tuple[dict, dict]:
    return model.config.to_dict(), {key: value.clone() for key, value in model.state_dict().items()}


def assert_unchanged(model, before: tuple[dict, dict]) -> None:
    config, state = before
    assert model.config.to_dict() == config
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(value, state[key]) for key, value in model.state_dict().items())


def test_config_only_push_and_load_back(fake_hub, tmp_path):
    base_commit = upload_base()
    model = load_base_patched(factor=4)
    before = snapshot(model)
    results = write_results(tmp_path, {"yarn:factor=4": YARN_PPL, "none": BASE_PPL})

    hub.push_to_hub(model, "me/tiny-yarn", eval_results=results)

    assert_unchanged(model, before)
    files = fake_hub.files("me/tiny-yarn")
    expected = [
        "README.md",
        "config.json",
        "eval_results.json",
        "frequencies.png",
        "hf_posenc.json",
        "ppl_vs_length.png",
    ]
    assert sorted(files) == expected
    assert files["ppl_vs_length.png"][:4] == b"\x89PNG"  # drawn for the push: the method and none only
    assert files["frequencies.png"][:4] == b"\x89PNG" and "frequencies.png" in files["README.md"].decode()
    assert json.loads(files["eval_results.json"]) == json.loads(results.read_text())  # no local path in it
    metadata = json.loads(files["hf_posenc.json"])
    assert (metadata["base_model"], metadata["base_revision"], metadata["weights"]) == (BASE_REPO, base_commit, False)
    card = ModelCard.load("me/tiny-yarn")
    assert (card.data.base_model, card.data.license) == (BASE_REPO, "apache-2.0")  # license from the base card
    assert {r.metric_args["context_length"]: r.metric_value for r in card.data.eval_results} == YARN_PPL
    config = AutoConfig.from_pretrained("me/tiny-yarn")
    assert config.rope_parameters["rope_type"] == "yarn" and config.rope_parameters["factor"] == 4.0

    upload_base(seed=1)  # the base repo moves on: the pushed config stays pinned to the commit it names
    loaded = hf_posenc.hub.push.from_pretrained("me/tiny-yarn")
    assert hf_posenc.get_patch(loaded) == hf_posenc.get_patch(model)
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=0)
    native = AutoModelForCausalLM.from_pretrained(BASE_REPO, revision=base_commit, config=config)  # card snippet 2
    torch.testing.assert_close(logits(native), logits(model), rtol=1e-6, atol=1e-6)
    assert not torch.allclose(logits(hf_posenc.unpatch(loaded)), logits(model), atol=1e-3)  # the patch matters


def test_full_push_of_a_model_built_here_with_a_method_transformers_cannot_express(fake_hub):
    model = hf_posenc.patch(make_tiny("llama"), "dynamic-yarn", original_max_position_embeddings=64)
    assert not hf_posenc.get_patch(model).native
    before = snapshot(model)  # no architectures / dtype in the config yet: save_pretrained would add them

    hub.push_to_hub(model, "me/tiny-dyn", with_weights=True, private=True, commit_message="full model")

    assert_unchanged(model, before)  # save_pretrained's config edits are undone
    repo = fake_hub.repos["me/tiny-dyn"]
    assert repo.private and repo.messages[repo.branches["main"]] == "full model"
    assert {"model.safetensors", "config.json", "README.md", "hf_posenc.json"} <= set(fake_hub.files("me/tiny-dyn"))
    metadata = json.loads(fake_hub.files("me/tiny-dyn")["hf_posenc.json"])
    assert (metadata["weights"], metadata["base_model"]) == (True, None)
    loaded = hf_posenc.hub.push.from_pretrained("me/tiny-dyn", attn_implementation="eager")  # as make_tiny
    assert hf_posenc.get_patch(loaded) == hf_posenc.get_patch(model)
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=0)


def test_push_to_a_branch_and_again_with_exist_ok(fake_hub):
    upload_base()
    model = load_base_patched(factor=2)
    hub.push_to_hub(model, "me/tiny-yarn", revision="exp", token=TOKEN)
    assert fake_hub.files("me/tiny-yarn", "main") == {}
    assert "config.json" in fake_hub.files("me/tiny-yarn", "exp")
    with pytest.raises(hub.HubPushError, match="exist_ok"):
        hub.push_to_hub(model, "me/tiny-yarn")
    hub.push_to_hub(model, "me/tiny-yarn", exist_ok=True)
    main, exp = fake_hub.files("me/tiny-yarn", "main"), fake_hub.files("me/tiny-yarn", "exp")
    assert main.pop("README.md") != exp.pop("README.md") and main == exp  # each card loads its own branch
    loaded = hf_posenc.hub.push.from_pretrained("me/tiny-yarn", revision="exp")
    assert hf_posenc.get_patch(loaded).params["factor"] == 2.0


def test_a_failed_push_deletes_the_branch_it_created_and_tells_when_it_cannot(fake_hub):
    """A commit to a new ``revision`` creates the branch first: when the commit fails, the branch goes again (a branch
    that was there stays); a branch that cannot be deleted is said in the error, which stays the commit's."""
    upload_base()
    model = load_base_patched(factor=2)
    hub.push_to_hub(model, "me/tiny", revision="kept")
    fake_hub.fail("commit", 500)
    for branch in ("new", "kept"):
        with pytest.raises(hub.HubPushError, match="Pushing to 'me/tiny' failed.*500") as raised:
            hub.push_to_hub(model, "me/tiny", revision=branch, exist_ok=True)
        assert "could not be deleted" not in str(raised.value)
    assert sorted(fake_hub.repos["me/tiny"].branches) == ["kept", "main"]
    fake_hub.fail("delete-branch", 401)  # echoes the token
    with pytest.raises(hub.HubPushError) as raised:
        hub.push_to_hub(model, "me/tiny", revision="new", exist_ok=True, token=TOKEN)
    said = str(raised.value)
    assert said.startswith("Pushing to 'me/tiny' failed") and raised.value.status_code == 500
    assert "The branch 'new' this push created could not be deleted (" in said and "401" in said
    assert_token_nowhere(raised.value, TOKEN)
    assert "new" in fake_hub.repos["me/tiny"].branches


def test_the_card_of_a_branch_loads_that_branch(fake_hub):
    upload_base()
    hub.push_to_hub(load_base_patched(factor=2), "me/tiny", revision="exp")
    card = fake_hub.files("me/tiny", "exp")["README.md"].decode()
    assert 'hf_posenc.from_pretrained("me/tiny", revision="exp")' in card
    assert 'config=AutoConfig.from_pretrained("me/tiny", revision="exp"))' in card
    assert "`hf-posenc check me/tiny --revision exp`" in card
    hub.push_to_hub(load_base_patched(factor=2), "me/tiny", revision="main", exist_ok=True)
    assert 'hf_posenc.from_pretrained("me/tiny")' in fake_hub.files("me/tiny", "main")["README.md"].decode()


def test_a_push_over_an_earlier_one_leaves_none_of_its_weights_or_results(fake_hub, tmp_path):
    """A config-only push with exist_ok over a full push with results: the old weights would load under the new
    config with plain transformers. Files a push never writes (added by hand) stay, weights in folders too."""
    upload_base()
    results = write_results(tmp_path, {"yarn:factor=4": YARN_PPL, "none": BASE_PPL})
    hub.push_to_hub(load_base_patched(factor=4), "me/tiny", with_weights=True, eval_results=results)
    by_hand = ["LICENSE", "adapter_model.safetensors", "onnx/model.safetensors"]
    for path in by_hand:
        HfApi(token=TOKEN).upload_file(path_or_fileobj=b"x", path_in_repo=path, repo_id="me/tiny")
    assert {"model.safetensors", "eval_results.json", "ppl_vs_length.png"} <= set(fake_hub.files("me/tiny"))
    model = load_base_patched("pi", factor=2)
    hub.push_to_hub(model, "me/tiny", exist_ok=True)
    pushed = ["README.md", "config.json", "frequencies.png", "hf_posenc.json"]  # pi's plot drawn anew
    assert sorted(fake_hub.files("me/tiny")) == sorted([*pushed, *by_hand])
    torch.testing.assert_close(logits(hf_posenc.hub.push.from_pretrained("me/tiny")), logits(model), rtol=0, atol=0)


def measured_at(tmp_path, **model_details):
    """Eval results of yarn:factor=4 on BASE_REPO whose model_details say ``model_details`` (revision, fingerprint)."""
    details = {"name": BASE_REPO, "dtype": "float32", **model_details}
    return write_results(tmp_path, {"yarn:factor=4": YARN_PPL, "none": BASE_PPL}, model_details=details)


def test_results_of_another_commit_of_the_base_are_refused_and_nothing_is_pushed(fake_hub, tmp_path, caplog):
    """A recorded commit is compared with the one pushed; a branch (``main`` too, when none was recorded) or tag with
    the commit it points at now; the same name as the push's is the same commit; a revision the Hub no longer has
    cannot be compared, and goes through with a warning."""
    first, second = upload_base(), upload_base(seed=1)  # main moves on
    HfApi(token=TOKEN).create_branch(BASE_REPO, branch="v1", revision=first)
    model = load_base_patched(factor=4)
    with pytest.raises(
        ValueError, match=rf"revision {first} of 'org/tiny-base', and the weights pushed come from its "
    ):
        hub.push_to_hub(model, "me/x", eval_results=measured_at(tmp_path, revision=first))
    assert "me/x" not in fake_hub.repos
    refused = {  # recorded revision, base_revision of the push -> what the message says was measured
        (first, None): first,
        ("main", first): f"'main' (now commit {second})",
        (None, first): f"'main' (now commit {second})",  # none recorded: eval loaded main
        ("v1", None): f"'v1' (now commit {first})",
        ("v1", "main"): f"'v1' (now commit {first})",
    }
    for (recorded, asked), said in refused.items():
        results = measured_at(tmp_path, **({"revision": recorded} if recorded else {}))
        with pytest.raises(ValueError, match=re.escape(f"measured on revision {said} of 'org/tiny-base'")):
            hub.build_card(model, "me/x", eval_results=results, base_revision=asked)
    accepted = [(second, None), (second.upper(), "main"), ("main", second), (None, "main"), ("v1", first), ("v1", "v1")]
    for recorded, asked in accepted:
        results = measured_at(tmp_path, **({"revision": recorded} if recorded else {}))
        hub.build_card(model, "me/x", eval_results=results, base_revision=asked)
    hub.build_card(model, "me/x", eval_results=measured_at(tmp_path, revision="deleted-branch"))
    assert "revision 'deleted-branch' of 'org/tiny-base', which the Hub does not have" in caplog.text
    saved = {"weights_from": BASE_REPO, "saved_patch": "yarn:factor=4", "revision": first}  # the saved repo's revision
    hub.build_card(model, "me/x", eval_results=measured_at(tmp_path, **saved))


def test_a_push_with_weights_compares_the_fingerprint_the_results_record(fake_hub, tmp_path):
    """The same weights are the same model whatever the commit's name; other weights are refused, nothing pushed; a
    fingerprint taken in another dtype cannot be compared, and the commit is: the one the weights were loaded at."""
    first = upload_base()
    base = AutoModelForCausalLM.from_pretrained(BASE_REPO).eval()
    fingerprint = model_fingerprint(base)
    second = upload_base(seed=1)  # main moves on; the model pushed is still the first commit's
    model = hf_posenc.patch(base, "yarn", factor=4, original_max_position_embeddings=64)
    same = measured_at(tmp_path, revision=first, fingerprint=fingerprint)
    hub.push_to_hub(model, "me/same", eval_results=same, with_weights=True, weights_fingerprint=fingerprint)
    other = measured_at(tmp_path, revision=first, fingerprint="0" * 16)
    with pytest.raises(
        ValueError, match=rf"other weights .* 0000000000000000 there, {fingerprint} here \(both float32"
    ):
        hub.push_to_hub(model, "me/other", eval_results=other, with_weights=True, weights_fingerprint=fingerprint)
    assert "me/other" not in fake_hub.repos
    in_bf16 = measured_at(tmp_path, revision=second, fingerprint="0" * 16, dtype="bfloat16")
    with pytest.raises(ValueError, match=f"measured on revision {second} .* come from its commit {first}"):
        hub.push_to_hub(model, "me/other", eval_results=in_bf16, with_weights=True, weights_fingerprint=fingerprint)
    in_bf16 = measured_at(tmp_path, revision=first, fingerprint="0" * 16, dtype="bfloat16")
    hub.build_card(model, "me/other", eval_results=in_bf16, with_weights=True, weights_fingerprint=fingerprint)


def test_a_config_only_push_over_a_full_one_leaves_none_of_its_tokenizer(fake_hub, tiny_dir, tmp_path):
    """The tokenizer a full push saved (config, vocabulary, chat templates) would load from the config-only repo pushed
    over it, whose card says to load the base's; a tokenizer of another kind (SentencePiece, BPE files) too."""
    upload_base()
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir / "model")
    tokenizer.chat_template = {"default": "{{ messages }}", "tool_use": "{{ tools }}"}
    saved = {Path(path).relative_to(tmp_path).as_posix() for path in tokenizer.save_pretrained(tmp_path)}
    assert "additional_chat_templates/tool_use.jinja" in saved
    hub.push_to_hub(load_base_patched(factor=4), "me/tiny", with_weights=True, tokenizer=tokenizer)
    assert saved <= set(fake_hub.files("me/tiny"))
    for path in ("tokenizer.model", "vocab.json", "merges.txt"):  # as another tokenizer's save_pretrained writes
        HfApi(token=TOKEN).upload_file(path_or_fileobj=b"x", path_in_repo=path, repo_id="me/tiny")
    hub.push_to_hub(load_base_patched(factor=4), "me/tiny", exist_ok=True)
    assert sorted(fake_hub.files("me/tiny")) == ["README.md", "config.json", "frequencies.png", "hf_posenc.json"]


def test_a_license_file_of_the_base_is_linked_in_the_base_repo(fake_hub):
    """A base card's relative license_link (its own LICENSE file) would be a broken link in the new repo."""
    api = HfApi(token=TOKEN)
    api.create_repo("org/licensed")
    with tempfile.TemporaryDirectory() as folder:
        make_tiny("llama").save_pretrained(folder)
        ModelCard("---\nlicense: other\nlicense_name: tiny\nlicense_link: LICENSE\n---\n").save(f"{folder}/README.md")
        commit = api.upload_folder(repo_id="org/licensed", folder_path=folder).oid
    model = hf_posenc.patch(AutoModelForCausalLM.from_pretrained("org/licensed"), "yarn", factor=2)
    hub.push_to_hub(model, "me/licensed")
    card = ModelCard.load("me/licensed")
    assert (card.data.license, card.data.license_name) == ("other", "tiny")
    assert card.data.license_link == f"{fake_hub.endpoint}/org/licensed/blob/{commit}/LICENSE"


def test_private_push_to_an_existing_public_repo_is_refused(fake_hub):
    upload_base()
    model = load_base_patched(factor=2)
    hub.push_to_hub(model, "me/tiny")
    before = fake_hub.files("me/tiny")
    with pytest.raises(hub.HubPushError, match="exists and is public"):
        hub.push_to_hub(model, "me/tiny", private=True, exist_ok=True)
    assert fake_hub.files("me/tiny") == before and not fake_hub.repos["me/tiny"].private


def test_a_push_without_the_hub_or_a_token_it_takes_stops_before_writing_anything(fake_hub, monkeypatch, capsys):
    """No token, a token the Hub refuses, an endpoint that does not answer, offline mode: one error before a weight
    is written (the library) or the model loads (the command), the token never shown."""
    from huggingface_hub import constants

    from hf_posenc.cli import main, share

    upload_base()
    model = load_base_patched(factor=2)
    monkeypatch.setattr(hub, "stage_repo", lambda *a, **k: pytest.fail("wrote the repo's files"))
    monkeypatch.setattr(share, "_patched_model", lambda *a, **k: pytest.fail("loaded the model"))
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(hub.HubPushError, match=r"needs a Hub token, and none is given or saved: log in"):
        hub.push_to_hub(model, "me/x")
    assert main(["push", "--model", BASE_REPO, "--method", "yarn:factor=2", "--repo", "me/x"]) == 1
    assert "needs a Hub token, and none is given or saved" in capsys.readouterr().err
    wrong = "hf_WrongTokenValue1234567890"
    with pytest.raises(hub.HubPushError, match=r"failed: HfHubHTTPError: .*401") as refused:  # reading the base first
        hub.push_to_hub(model, "me/x", token=wrong)
    assert wrong not in str(refused.value)
    with pytest.raises(hub.HubPushError, match=r"checking the token\) failed: .*Invalid user token") as refused:
        local = hf_posenc.patch(make_tiny("llama"), "yarn", factor=2)  # built here: no base to read first
        hub.push_to_hub(local, "me/x", with_weights=True, token=wrong)
    assert wrong not in str(refused.value)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(hub.HubPushError, match="HF_HUB_OFFLINE is set, and a push needs the Hub"):
        hub.push_to_hub(model, "me/x", token=TOKEN)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:1")  # nothing listens there
    with pytest.raises(hub.HubPushError, match=r"\(reading the base model 'org/tiny-base'\) failed: ConnectError"):
        hub.push_to_hub(model, "me/x", token=TOKEN)
    with pytest.raises(hub.HubPushError, match=r"\(checking the token\) failed: ConnectError"):
        hub.push_to_hub(local, "me/x", with_weights=True, token=TOKEN)
    assert "me/x" not in fake_hub.repos


def test_gpt2_pi_is_in_the_weights_so_a_config_only_push_is_refused(fake_hub):
    api = HfApi(token=TOKEN)
    api.create_repo("org/gpt2")
    with tempfile.TemporaryDirectory() as folder:
        make_tiny("gpt2").save_pretrained(folder)
        api.upload_folder(repo_id="org/gpt2", folder_path=folder)
    model = hf_posenc.patch(AutoModelForCausalLM.from_pretrained("org/gpt2").eval(), "pi", factor=2)
    with pytest.raises(
        ValueError, match=r"position table, resampled to 128 rows.*Push the weights too \(`with_weights`\)"
    ):
        hub.push_to_hub(model, "me/gpt2-pi")
    assert "me/gpt2-pi" not in fake_hub.repos
    hub.push_to_hub(model, "me/gpt2-pi", with_weights=True)
    loaded = AutoModelForCausalLM.from_pretrained("me/gpt2-pi").eval()  # a plain GPT-2 with 128 positions
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=0)


def test_a_trained_t5_table_needs_the_weights_pushed(fake_hub):
    """A config-only repo loads the T5 table at the patch's start: as pushed just after the patch, fine; trained
    since, refused (the push left nothing behind) until the weights go too, which load back the trained table."""
    upload_base()
    model = hf_posenc.patch(AutoModelForCausalLM.from_pretrained(BASE_REPO).eval(), "t5-bias")
    hub.push_to_hub(model, "me/t5-start")  # the table as patched: a config-only repo gives it back
    torch.testing.assert_close(logits(hf_posenc.from_pretrained("me/t5-start")), logits(model), rtol=0, atol=0)
    [(name, table)] = hf_posenc.patching.added_tensors(model).items()
    with torch.no_grad():  # "trained"
        table.add_(torch.randn(table.shape, generator=torch.Generator().manual_seed(0)))
    with pytest.raises(
        ValueError, match=rf"'t5-bias[^']*' changed {name}, which it added, since the patch \(trained\).*`with_weights`"
    ):
        hub.push_to_hub(model, "me/t5-trained")
    assert "me/t5-trained" not in fake_hub.repos
    hub.push_to_hub(model, "me/t5-trained", with_weights=True)
    torch.testing.assert_close(logits(hf_posenc.from_pretrained("me/t5-trained")), logits(model), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("failure", "status"),
    [("server error on commit", 500), ("wrong token", 401), ("repo exists, no exist_ok", 409)],
)
def test_failed_push_is_clear_changes_nothing_and_hides_the_token(fake_hub, tmp_path, capfd, caplog, failure, status):
    upload_base()
    model = load_base_patched(factor=4)
    results = write_results(tmp_path, {"yarn:factor=4": YARN_PPL, "none": BASE_PPL})
    local_files = {path: path.read_bytes() for path in tmp_path.iterdir() if path.is_file()}
    before = snapshot(model)
    token = TOKEN
    if status == 500:
        fake_hub.fail("commit", 500)
    elif status == 401:
        token = "hf_WrongTokenThatMustNeverBePrinted42"
    else:
        HfApi(token=TOKEN).create_repo("me/tiny-yarn")
    caplog.set_level(logging.DEBUG)

    with pytest.raises(hub.HubPushError) as raised:
        hub.push_to_hub(model, "me/tiny-yarn", eval_results=results, token=token)

    error = raised.value
    assert error.status_code == status and "me/tiny-yarn" in str(error) and str(status) in str(error)
    shown = "".join(traceback.format_exception(error)) + caplog.text + "".join(capfd.readouterr())
    assert token not in shown
    if status == 401:
        assert any(token in (r.authorization or "") for r in fake_hub.requests)  # it was sent, never shown
    assert fake_hub.files("me/tiny-yarn") == {}  # nothing committed
    assert_unchanged(model, before)
    assert {path: path.read_bytes() for path in tmp_path.iterdir() if path.is_file()} == local_files


def assert_token_nowhere(error: BaseException, token: str) -> None:
    """``token`` is in nothing reachable from ``error``: the formatted traceback, and for the whole chain
    (``__cause__``, ``__context__``) each link's str, repr, args and the headers of its request, if any."""
    assert token not in "".join(traceback.format_exception(error))
    links, seen = [error], set()
    while links:
        link = links.pop()
        if link is None or id(link) in seen:
            continue
        seen.add(id(link))
        request = getattr(getattr(link, "response", None), "request", None)
        shown = [str(link), repr(link), *map(repr, link.args), repr(dict(request.headers) if request else {})]
        assert not any(token in text for text in shown), (type(link), shown)
        links += [link.__cause__, link.__context__]


# A 401 that echoes the request's Authorization header, on every Hub call that carries the token: route and repo
# failing, the call, the error raised, and what its message says was being done.
ECHOED_401 = {
    "push reads the base": (
        ("info", BASE_REPO),
        lambda model: hub.push_to_hub(model, "me/other", base_model=BASE_REPO),
        hub.HubPushError,
        "Pushing to 'me/other' (reading the base model 'org/tiny-base') failed",
    ),
    "card reads the base": (
        ("info", BASE_REPO),
        lambda model: hub.build_card(model, "me/other", base_model=BASE_REPO, token=TOKEN),
        hub.HubError,
        "Rendering the card of 'me/other' (reading the base model 'org/tiny-base') failed",
    ),
    "from_pretrained reads the record": (
        ("resolve", "me/tiny-yarn"),
        lambda model: hub.from_pretrained("me/tiny-yarn"),
        hub.HubError,
        "Reading hf_posenc.json of 'me/tiny-yarn' failed",
    ),
    "from_pretrained loads the base weights": (
        ("resolve", BASE_REPO),
        lambda model: hub.from_pretrained("me/tiny-yarn", token=TOKEN),
        hub.HubError,
        "Loading 'me/tiny-yarn' failed",
    ),
    "read_metadata": (
        ("resolve", "me/tiny-yarn"),
        lambda model: hub.read_metadata("me/tiny-yarn", token=TOKEN),
        hub.HubError,
        "Reading hf_posenc.json of 'me/tiny-yarn' failed",
    ),
}


@pytest.mark.parametrize("case", list(ECHOED_401))
def test_a_401_echoing_the_token_raises_an_error_without_it(fake_hub, case):
    (route, repo_id), call, error_type, action = ECHOED_401[case]
    upload_base()
    model = hf_posenc.patch(make_tiny("llama"), "yarn", factor=4, original_max_position_embeddings=64)
    hub.push_to_hub(model, "me/tiny-yarn", base_model=BASE_REPO)  # nothing downloaded: nothing cached
    fake_hub.fail(route, 401, repo_id)
    with pytest.raises(HfHubHTTPError, match=TOKEN):  # the raw client's error shows it: the server echoes it
        HfApi().model_info(repo_id) if route == "info" else hf_hub_download(repo_id, "config.json")

    with pytest.raises(error_type) as raised:
        call(model)

    assert str(raised.value).startswith(action) and raised.value.status_code == 401
    assert "Bearer ***" in str(raised.value)  # the echo reached the message, redacted
    assert_token_nowhere(raised.value, TOKEN)


def test_config_only_push_needs_a_hub_base(fake_hub, tmp_path):
    make_tiny("llama").save_pretrained(tmp_path / "local")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "local")
    hf_posenc.patch(model, "yarn", factor=4, original_max_position_embeddings=64)
    with pytest.raises(ValueError, match="needs the Hub id of the base model"):
        hub.push_to_hub(model, "me/tiny-yarn")
    assert fake_hub.requests == []


def test_local_folders_without_or_with_a_newer_record(tmp_path):
    model = hf_posenc.patch(make_tiny("llama"), "pi", factor=2, original_max_position_embeddings=64)
    model.save_pretrained(tmp_path)  # no hf_posenc.json: loads like hf_posenc.patching.load_patched_model
    loaded = hf_posenc.hub.push.from_pretrained(str(tmp_path), attn_implementation="eager")
    assert hf_posenc.get_patch(loaded) == hf_posenc.get_patch(model)
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=0)
    (tmp_path / hub.METADATA_FILE).write_text(json.dumps({"format": 2, "weights": False, "base_model": "org/x"}))
    with pytest.raises(ValueError, match="Upgrade hf_posenc"):
        hf_posenc.hub.push.from_pretrained(str(tmp_path))


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("not json", r"hf_posenc.json of '.*' is not a JSON file: Expecting value"),
        ("[1]", r"hf_posenc.json of '.*' holds a JSON list, not an object"),
        ('{"format": 1}', r"hf_posenc.json of '.*' is malformed: 'weights' is None, not true or false"),
        ('{"format": 1, "weights": false}', r"'.*' holds no weights and names no base model to load"),
        (
            '{"format": 1, "weights": false, "base_model": "org/x", "base_revision": 7}',
            r"hf_posenc.json of '.*' is malformed: 'base_revision' is 7, not a commit",
        ),
        *(
            (
                json.dumps({"format": 1, "weights": False, "base_model": "org/x", "base_gguf_file": gguf}),
                rf"hf_posenc.json of '.*' is malformed: 'base_gguf_file' is {re.escape(repr(gguf))}, not a file in",
            )
            for gguf in ["../../etc/model.gguf", "/abs/model.gguf", "", 3]
        ),
    ],
)
def test_a_malformed_record_is_refused_by_name(tmp_path, text, said):
    """A hand-edited or foreign hf_posenc.json: one ValueError naming the file, not a KeyError or AttributeError
    from deep inside, when loading, evaluating or checking the folder."""
    hf_posenc.patch(make_tiny("llama"), "pi", factor=2, original_max_position_embeddings=64).save_pretrained(tmp_path)
    (tmp_path / hub.METADATA_FILE).write_text(text)
    with pytest.raises(ValueError, match=said):
        hf_posenc.hub.push.from_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match=said):
        saved_patch(str(tmp_path))


def test_plain_saved_model_on_the_hub_loads_online_then_offline(fake_hub):
    model = hf_posenc.patch(make_tiny("llama"), "ntk", factor=2, original_max_position_embeddings=64)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)  # what transformers' own push_to_hub uploads: no hf_posenc.json
        HfApi(token=TOKEN).create_repo("me/plain")
        HfApi(token=TOKEN).upload_folder(repo_id="me/plain", folder_path=folder, commit_message="plain")
    online = hf_posenc.hub.push.from_pretrained("me/plain", attn_implementation="eager")
    fake_hub.stop()
    offline = hf_posenc.hub.push.from_pretrained("me/plain", attn_implementation="eager", local_files_only=True)
    for loaded in (online, offline):
        assert hf_posenc.get_patch(loaded) == hf_posenc.get_patch(model)
        torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=0)


def test_pushed_results_are_standard_json_with_the_status_of_non_finite_rows(fake_hub, tmp_path):
    """A results file with bare Infinity / NaN (which Python's json writes by default: a file made by another
    program) is pushed as standard JSON: null and the row's status, so that the Hub's viewer and strict parsers read
    it."""
    upload_base()
    rows = {"yarn:factor=4": {**YARN_PPL, 8192: math.inf, 16384: math.nan}, "none": BASE_PPL}
    results = write_results(tmp_path, rows)
    assert "Infinity" in results.read_text()
    hub.push_to_hub(load_base_patched(factor=4), "me/strict", eval_results=results)

    def refuse(constant):
        raise ValueError(constant)

    pushed = json.loads(fake_hub.files("me/strict")["eval_results.json"], parse_constant=refuse)["results"]
    statuses = {row["length"]: (row["ppl"], row.get("status")) for row in pushed if row["method"] != "none"}
    assert statuses[8192] == (None, "overflow") and statuses[16384] == (None, "nan")
    assert all(status is None for length, (_, status) in statuses.items() if length < 8192)


@pytest.mark.parametrize("name", ["/models/absent", "./absent", "../absent", "~/absent", "a/b/c", "C:\\models\\m"])
def test_a_path_to_nothing_is_refused_before_the_hub_is_asked(tmp_path, monkeypatch, name):
    """Asked, the Hub would answer that the name is no valid repo id."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        refuse_missing_folder(name)
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        hf_posenc.from_pretrained(name)


@pytest.mark.parametrize("name", ["gpt2", "org/name", "org/name.v2"])
def test_hub_ids_and_existing_folders_go_on(tmp_path, name):
    refuse_missing_folder(name)  # a Hub id: for the Hub to answer
    (tmp_path / "a" / "b").mkdir(parents=True)
    refuse_missing_folder(str(tmp_path / "a" / "b"))
