"""``card`` and ``push`` check the repo and branch they name with the same rule, before any model loads: huggingface_hub's
own check of a repo id, and a branch name git and the Hub take. Nothing is written for a refused one."""

from __future__ import annotations

import pytest
from tiny_models import make_tiny

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.hub.push import build_card, push_to_hub
from hf_posenc.hub.reach import check_target

BAD_REPOS = ["me/x\n# injected", "me/x<script>", "../../x", "me/x`y`", "a/b/c", "me/x y"]
BAD_REVISIONS = ["../../etc", "v1\n# injected", "a`b`", "main..x", "x/", "-x", "x.lock", "<b>"]


@pytest.mark.parametrize("repo", BAD_REPOS)
def test_a_repo_id_the_hub_refuses_is_refused(repo):
    with pytest.raises(ValueError, match=r"`repo` .* is not a Hub repo id"):
        check_target(repo)


@pytest.mark.parametrize("revision", BAD_REVISIONS)
def test_a_branch_the_hub_cannot_have_is_refused(revision):
    with pytest.raises(ValueError, match=r"`revision` .* is not a branch name the Hub takes"):
        check_target("me/x", revision)


@pytest.mark.parametrize("revision", [None, "main", "refs/pr/1", "v1.0", "feature/long-context_2", "a" * 40])
def test_ordinary_targets_pass(revision):
    check_target("me/qwen-yarn4", revision)
    check_target("qwen-yarn4", revision)  # the card's default: no namespace


def test_build_card_and_push_refuse_them_before_reading_anything(monkeypatch):
    model = hf_posenc.patch(make_tiny("llama"), "yarn", factor=2)

    def never(*args, **kwargs):
        raise AssertionError("reached the Hub")

    monkeypatch.setattr("hf_posenc.hub.push.HfApi", never)
    for call in (build_card, push_to_hub):
        with pytest.raises(ValueError, match="not a Hub repo id"):
            call(model, "me/x<script>", base_model="org/base")
        with pytest.raises(ValueError, match="not a branch name"):
            call(model, "me/x", base_model="org/base", revision="../../etc")


@pytest.mark.parametrize("command", ["card", "push"])
def test_the_commands_refuse_them_in_one_line_before_the_model_loads(command, tmp_path, capsys, monkeypatch):
    from hf_posenc.cli import share

    monkeypatch.setattr(share, "_patched_model", lambda *a, **k: pytest.fail("loaded the model"))
    output = tmp_path / "README.md"
    args = [command, "--model", "org/base", "--method", "yarn:factor=2", "--repo", "me/x", "--revision", "a`b`"]
    assert main([*args, *(["--output", str(output)] if command == "card" else [])]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"hf-posenc {command}: error: --revision 'a`b`' is not a branch name") and err.count("\n") == 1
    )
    assert not output.exists()


BAD_LICENSES = ["mit\n# injected", "<script>x</script>", "apache-2.0 `x`", "[x](javascript:alert(1))", ""]


@pytest.mark.parametrize("license", BAD_LICENSES)
def test_a_license_that_is_no_identifier_is_refused_before_reading_anything(license, monkeypatch):
    model = hf_posenc.patch(make_tiny("llama"), "yarn", factor=2)
    monkeypatch.setattr("hf_posenc.hub.push.HfApi", lambda *a, **k: pytest.fail("reached the Hub"))
    for call in (build_card, push_to_hub):
        with pytest.raises(ValueError, match=r"`license` .* is not a license identifier"):
            call(model, "me/x", base_model="org/base", license=license)


@pytest.mark.parametrize(
    "names, refused",
    [
        ({"base_model": "org/ti`ny<script>"}, "`base_model` .* is not a Hub repo id"),
        ({"base_model": "org/x\n# injected"}, "`base_model` .* is not a Hub repo id"),
        ({"base_revision": 'abc"\n# injected'}, "`base_revision` .* is not a revision"),
        ({"license_info": {"license": "other", "license_name": "x\n# injected"}}, "`license_name` .* is not a license"),
        ({"license_info": {"license": "other", "license_link": "javascript:alert(1)"}}, "`license_link` .* http"),
    ],
)
def test_the_card_writes_no_name_that_could_add_markdown_or_html(names, refused):
    """What a card writes as it is (the base model in a link and a snippet, its revision in a snippet, the license in
    the metadata the Hub shows as a link) is a name of its kind, or the card is not rendered."""
    from hf_posenc.hub.card import render_card

    model = hf_posenc.patch(make_tiny("llama"), "yarn", factor=2)
    given = {"base_model": "org/base", "base_revision": None, **names}
    with pytest.raises(ValueError, match=refused):
        render_card(model.config, repo_id="me/x", config_only=True, **given)
    ordinary = {"license": "other", "license_name": "llama3.1", "license_link": "https://example.com/LICENSE.txt"}
    card = render_card(model.config, repo_id="me/x", base_model="org/base", base_revision="a" * 40, config_only=True,
                       license_info=ordinary)  # fmt: skip
    assert "license_link: https://example.com/LICENSE.txt" in str(card)


@pytest.mark.parametrize("command", ["card", "push"])
def test_the_commands_refuse_a_bad_license_in_one_line_before_the_model_loads(command, tmp_path, capsys, monkeypatch):
    from hf_posenc.cli import share

    monkeypatch.setattr(share, "_patched_model", lambda *a, **k: pytest.fail("loaded the model"))
    output = tmp_path / "README.md"
    args = [command, "--model", "org/base", "--method", "yarn:factor=2", "--license", "mit\n# x"]
    args += ["--output", str(output)] if command == "card" else ["--repo", "me/x"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hf-posenc {command}: error: --license 'mit\\n# x' is not a license identifier"), err
    assert err.count("\n") == 1 and not output.exists()
