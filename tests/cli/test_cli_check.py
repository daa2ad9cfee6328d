"""``hf-posenc check``: a saved folder, a config.json path, a Hub repo at a revision, --json, and bad input in one
line with exit status 2."""

from __future__ import annotations

import json
import logging

import pytest
from hub_server import TOKEN
from huggingface_hub import HfApi
from tiny_models import make_tiny

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.serving.engines import ENGINES, engine_findings


@pytest.fixture(autouse=True)
def quiet():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def save(folder, method: str, **params):
    hf_posenc.patch(make_tiny("llama"), method, **params).config.save_pretrained(folder)
    return folder


def test_a_saved_folder_every_engine_builds_alike_exits_0_with_a_table(tmp_path, capsys):
    folder = save(tmp_path / "yarn", "yarn", factor=4)
    assert main(["check", str(folder)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{folder}: hf_posenc record: yarn"
    width = max(len(e.release) for e in ENGINES)  # "llama.cpp" and its release set the widths
    assert lines[1].split(" | ") == ["engine   ", "read from".ljust(width), "verdict", "detail"]
    rows = [line.split(" | ")[:3] for line in lines[2:]]
    assert rows == [[e.name.ljust(9), e.release.ljust(width), "ok     "] for e in ENGINES]


def test_a_config_json_path_some_engine_builds_otherwise_exits_1(tmp_path, capsys):
    path = save(tmp_path / "parts", "ntk-by-parts", factor=4) / "config.json"
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "| differs | YaRN s=4: attention factor 1.1386 where transformers uses 1.0000" in out


def test_json_output_is_the_findings(tmp_path, capsys):
    folder = save(tmp_path / "dyn", "dynamic-yarn")
    assert main(["check", str(folder), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    config = json.loads((folder / "config.json").read_text())
    assert report["findings"] == [vars(finding) for finding in engine_findings(config)]
    expected = {"method": "dynamic-yarn", "native": False, "version": hf_posenc.__version__, "known": True}
    assert report["hf_posenc"] == expected and report["exit_status"] == 1
    assert set(report["engines"]) == {engine.name for engine in ENGINES}


@pytest.mark.parametrize(
    ("method", "params", "noted"),
    [
        ("self-extend", {"group_size": 2, "window": 16}, ["llama.cpp"]),
        ("self-extend+logn", {"group_size": 2, "window": 16}, ["llama.cpp"]),
        ("string", {"shifted_offset": 20, "local_value": 4}, ["vllm"]),
        ("rerope", {"window": 8}, []),
        ("leaky-rerope", {"window": 8}, []),
        ("dca", {}, []),
    ],
)
def test_the_remaps_are_served_by_no_engine_and_lookalikes_are_named(tmp_path, capsys, method, params, noted):
    """No engine builds hf_posenc's remaps (refused, or plain RoPE in llama.cpp); where an engine has a feature
    that looks like the method but is not it, a note says so (table and JSON)."""
    folder = save(tmp_path / "remap", method, **params)
    assert main(["check", str(folder)]) == 1
    out = capsys.readouterr().out
    verdicts = {line.split(" | ")[0].strip(): line.split(" | ")[2].strip() for line in out.splitlines()[2:6]}
    assert verdicts == {"vllm": "refused", "sglang": "refused", "llama.cpp": "ignored", "tgi": "refused"}
    notes = [line.split(":")[1].strip() for line in out.splitlines() if line.startswith("note: ")]
    assert notes == noted
    if "llama.cpp" in noted:
        assert "group attention (--grp-attn-n G, --grp-attn-w W) is not this Self-Extend" in out
    assert main(["check", str(folder), "--json"]) == 1
    assert [note["engine"] for note in json.loads(capsys.readouterr().out)["notes"]] == noted


def test_the_verdicts_are_on_the_file_as_written(tmp_path, capsys):
    """transformers' config class standardizes the rope dict in place (adds L and rope_theta): ``check`` judges the
    engines on the file as written, not on the dict its validation changed, where TGI's KeyError would read as ok."""
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "max_position_embeddings": 256,
        "rope_theta": 10000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
    }
    path = write(tmp_path / "config.json", json.dumps(config))
    assert main(["check", str(path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["findings"] == [vars(finding) for finding in engine_findings(config)]
    assert {finding["engine"]: finding["severity"] for finding in report["findings"]}["tgi"] == "refused"


def _without_release(line: str) -> str:
    """A row of the table without its ``read from`` column."""
    cells = line.split(" | ")
    return " | ".join([cells[0], *cells[2:]])


def write(path, text: str):
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda tmp: tmp / "missing" / "config.json", "no such file or folder (a path, not a Hub id)"),
        (lambda tmp: tmp, "has no config.json"),
        (lambda tmp: write(tmp / "config.json", "{not json"), "is not a JSON file"),
        (lambda tmp: write(tmp / "config.json", "[1, 2]"), "holds a JSON list, not a config object"),
    ],
    ids=["missing", "no-config", "not-json", "not-object"],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, make, expected):
    assert main(["check", str(make(tmp_path))]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("hf-posenc check: error: ") and expected in captured.err


def test_revision_is_for_hub_ids_only(tmp_path, capsys):
    folder = save(tmp_path / "yarn", "yarn", factor=4)
    assert main(["check", str(folder), "--revision", "main"]) == 2
    assert "--revision is for a Hub repo id" in capsys.readouterr().err


def test_a_hub_repo_at_a_revision(fake_hub, tmp_path, capsys):
    api = HfApi(token=TOKEN)
    api.create_repo("me/checked")
    api.upload_folder(repo_id="me/checked", folder_path=save(tmp_path / "yarn", "yarn", factor=4))
    api.create_branch("me/checked", branch="exp")
    api.upload_folder(repo_id="me/checked", folder_path=save(tmp_path / "pi", "pi", factor=4), revision="exp")
    assert main(["check", "me/checked"]) == 0
    assert capsys.readouterr().out.startswith("me/checked: hf_posenc record: yarn\n")
    assert main(["check", "me/checked", "--revision", "exp", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert (report["revision"], report["hf_posenc"]["method"]) == ("exp", "pi")
    assert dict((f["engine"], f["severity"]) for f in report["findings"])["tgi"] == "ignored"  # linear
    assert main(["check", "me/absent"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Reading config.json of 'me/absent' failed" in err and TOKEN not in err


def test_malformed_rope_values_are_one_line(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"rope_scaling": {"type": "yarn", "factor": "x"}}))
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hf-posenc check: error:") and "its RoPE keys are malformed" in err and "\n" not in err


_LLAMA = '{"model_type": "llama", "max_position_embeddings": 256, "rope_parameters": %s}'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"rope_scaling": "yarn"}', "rope_scaling is a str, not an object"),
        ('{"rope_scaling": {"type": "yarn", "factor": NaN}}', "rope_scaling.factor is nan, not a finite number > 0"),
        ('{"rope_scaling": {"type": "dynamic", "factor": -2}}', "rope_scaling.factor is -2"),
        ('{"rope_scaling": {"type": "linear", "factor": true}}', "rope_scaling.factor is True"),
        ('{"rope_parameters": {"rope_type": "yarn", "factor": 1e400}}', "rope_parameters.factor is inf"),
        ('{"max_position_embeddings": 0, "rope_theta": 1e4}', "max_position_embeddings is 0"),
        ('{"partial_rotary_factor": "xx", "head_dim": 16}', "partial_rotary_factor is 'xx', not a finite number > 0"),
        (
            '{"partial_rotary_factor": 7, "head_dim": 16}',
            "partial_rotary_factor is 7, more than 1 (the fraction of each",
        ),
        (
            '{"rope_parameters": {"rope_type": "default", "partial_rotary_factor": "half"}}',
            "partial_rotary_factor is 'half'",
        ),
        ('{"rope_parameters": {"rope_type": "yarn", "factor": 4, "attention_factor": NaN}}', "attention_factor is nan"),
        ("[" * 100000 + "]" * 100000, "is not a JSON file"),  # nested past Python's recursion limit
        # what transformers' config class refuses (so there is no model to compare the engines' with)
        (_LLAMA % '{"rope_type": "yarn", "original_max_position_embeddings": 64}', "{'factor'}"),
        (_LLAMA % '{"rope_type": "llama3", "factor": 4, "original_max_position_embeddings": 64}', "'llama3'"),
        (_LLAMA % '{"rope_type": "yarn", "factor": 4, "beta_fast": "32"}', "TypeError: '<' not supported"),
        ('{"rope_parameters": {"full_attention": "yarn", "sliding_attention": {}}}', "full_attention is a str"),
    ],
)
def test_values_no_engine_could_read_are_one_line(tmp_path, capsys, text, message):
    path = tmp_path / "config.json"
    path.write_text(text)
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hf-posenc check: error:") and message in err and "\n" not in err, err


def test_llama_cpp_refuses_the_weights_of_a_t5_bias_model_and_ignores_its_config_alone(tmp_path, capsys):
    """The T5 table the patch adds has no GGUF name: llama.cpp's converter refuses weights that hold it. A saved
    folder with its weights says so; the same config.json alone (no weights beside it) is plain RoPE there."""
    model = hf_posenc.patch(make_tiny("llama"), "t5-bias")
    model.save_pretrained(tmp_path / "saved")
    (tmp_path / "config-only").mkdir()
    (tmp_path / "config-only" / "config.json").write_bytes((tmp_path / "saved" / "config.json").read_bytes())

    def llama_cpp(source) -> str:
        assert main(["check", str(source)]) == 1
        line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("llama.cpp"))
        return _without_release(line)

    assert llama_cpp(tmp_path / "saved").startswith("llama.cpp | refused | its converter has no GGUF name for the")
    assert llama_cpp(tmp_path / "saved" / "config.json").startswith("llama.cpp | refused |")
    assert llama_cpp(tmp_path / "config-only").startswith("llama.cpp | ignored | rope type 'hf_posenc_t5_bias'")


def edit_config(folder, edit):
    """``folder``'s config.json changed by ``edit(config)``."""
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_record_of_a_method_this_version_does_not_know_says_so(tmp_path, capsys):
    """A newer hf_posenc's method (or a typo): the engines are judged on the config as ever, and the record's line
    says that this version cannot load it, what it knows and which version wrote the record."""
    folder = edit_config(save(tmp_path / "new", "yarn", factor=4), lambda c: c["hf_posenc"].update(
        method="yarn-2", version="9.0.0"))  # fmt: skip
    assert main(["check", str(folder)]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith(f"{folder}: hf_posenc record: yarn-2 (unknown to this hf_posenc {hf_posenc.__version__}; ")
    assert "the record was written by hf_posenc 9.0.0. Unknown method 'yarn-2'. Available methods: alibi, " in line
    assert main(["check", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hf_posenc"] == {
        "method": "yarn-2", "native": True, "version": "9.0.0", "known": False
    }  # fmt: skip


def test_a_record_with_a_parameter_this_version_does_not_know_says_so(tmp_path, capsys):
    """A newer hf_posenc's parameter of a known method: not a departure of the config from the record (a
    ``record | differs`` finding, exit 1), but a note on the record's line naming the version that wrote it."""
    folder = edit_config(save(tmp_path / "new", "yarn", factor=4), lambda c: c["hf_posenc"].update(
        params={**c["hf_posenc"]["params"], "new_knob": 2}, version="9.0.0"))  # fmt: skip
    assert main(["check", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "record" not in out.split("\n", 1)[1]
    assert out.startswith(
        f"{folder}: hf_posenc record: yarn (its parameters do not build it in this hf_posenc {hf_posenc.__version__}; "
        "the record was written by hf_posenc 9.0.0. Unknown parameter(s) 'new_knob'"
    )
    assert main(["check", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hf_posenc"]["known"] is False


def _rope(**values):
    """An edit setting ``values`` in the config's rope dicts (both, as transformers 5 saves them)."""
    return lambda config: [config[key].update(values) for key in ("rope_scaling", "rope_parameters") if config.get(key)]


@pytest.mark.parametrize(
    ("method", "params", "edit", "gap"),
    [
        (
            "yarn",
            {"factor": 4},
            _rope(rope_type="linear", type="linear"),
            "says rope type 'linear', where yarn's is 'yarn'",
        ),
        ("yarn", {"factor": 4}, _rope(factor=8.0), "has factor 8.0 where the record has 4.0"),
        ("ntk", {"factor": 4}, _rope(rope_type="dynamic", type="dynamic", factor=4.0), "where ntk's is 'default'"),
        (
            "dynamic-yarn",
            {},
            _rope(rope_type="linear", type="linear", factor=4.0),
            "where the record says hf_posenc's own",
        ),
        ("dynamic-yarn", {}, _rope(method="dynamic-ntk"), "names method 'dynamic-ntk'"),
    ],
    ids=["yarn-linear", "yarn-factor", "ntk-dynamic", "own-linear", "own-other-method"],
)
def test_a_record_the_config_contradicts_is_flagged(tmp_path, capsys, method, params, edit, gap):
    """hf_posenc loads (and the card describes) the record's method, transformers and every engine the config's:
    a config edited after the patch, or a record copied from another model, serve another model than recorded."""
    folder = edit_config(save(tmp_path / "m", method, **params), edit)
    assert main(["check", str(folder)]) == 1
    record = _without_release(next(line for line in capsys.readouterr().out.splitlines() if line.startswith("record ")))
    assert record.startswith(f"record    | differs | the hf_posenc record says {method}; ") and gap in record


CLOSED = "http://127.0.0.1:1"  # nothing listens there: every connection is refused at once


@pytest.fixture
def retries(monkeypatch) -> list[float]:
    """The waits of huggingface_hub's retries (recorded, not slept)."""
    from types import SimpleNamespace

    from huggingface_hub.utils import _http

    waits: list[float] = []
    monkeypatch.setattr(_http, "time", SimpleNamespace(sleep=waits.append))
    return waits


def test_a_hub_that_cannot_be_reached_fails_at_once_or_reads_the_cache(
    fake_hub, tmp_path, capsys, retries, monkeypatch
):
    """No network (here: a refused connection) and a repo not in the cache, a mistyped name say: the command
    fails at once, without huggingface_hub's 5 retries (1 + 2 + 4 + 8 + 8 s). A repo read before is read from the
    cache."""
    from huggingface_hub import constants

    HfApi(token=TOKEN).create_repo("me/cached")
    HfApi(token=TOKEN).upload_folder(repo_id="me/cached", folder_path=save(tmp_path / "yarn", "yarn", factor=4))
    assert main(["check", "me/cached"]) == 0
    capsys.readouterr()
    template = constants.HUGGINGFACE_CO_URL_TEMPLATE.replace(fake_hub.endpoint, CLOSED)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    assert main(["check", "me/cahced"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hf-posenc check: error: Reading config.json of 'me/cahced' failed: the Hub cannot be ")
    assert "reached (ConnectError: " in err and err.endswith("and no copy of it is in the cache.\n")
    assert main(["check", "me/cached"]) == 0 and retries == []
    assert capsys.readouterr().out.startswith("me/cached: hf_posenc record: yarn\n")


def test_offline_mode_says_so(fake_hub, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert main(["check", "me/never-read"]) == 2
    assert "failed: the Hub cannot be reached (HF_HUB_OFFLINE is set), and no copy" in capsys.readouterr().err


MISTRAL_PARAMS = {"dim": 4096, "n_layers": 32, "head_dim": 128, "n_heads": 32, "n_kv_heads": 8, "rope_theta": 1e6}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"max_position_embeddings": 256, "rope_theta": 1e4}, "is not a transformers config: it has no model_type"),
        (MISTRAL_PARAMS, "no model_type key (it is Mistral's own params.json format)"),
        ({"model_type": "no-such-model", "rope_theta": 1e4}, "model_type 'no-such-model' is unknown to transformers"),
        ({"model_type": ["llama"]}, "model_type ['llama'] is unknown to transformers"),
    ],
    ids=["no-model-type", "mistral-params", "unknown-type", "not-a-name"],
)
def test_a_config_no_engine_loads_is_named_as_such(tmp_path, capsys, config, message):
    """No model type, an unknown one, or another format: one line naming the file, exit 2, and no engine called ok."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["check", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"hf-posenc check: error: {tmp_path}/config.json") and message in captured.err


@pytest.mark.parametrize(
    ("rope", "message"),
    [
        ('{"rope_type": "yarn", "factor": 3e7, "original_max_position_embeddings": 64}', "factor must be at most 2^24"),
        ('{"rope_type": "linear", "factor": 0.5}', "rope_parameters.factor must be >= 1"),
        (
            '{"rope_type": "longrope", "factor": 4, "original_max_position_embeddings": 64, "long_factor": [1, 2],'
            ' "short_factor": [1, 1, 1, 1, 1, 1, 1, 1]}',
            "rope_parameters.long_factor holds 2 values, not one per rotary pair (16 // 2)",
        ),
    ],
)
def test_the_bounds_patch_applies_are_applied(tmp_path, capsys, rope, message):
    """A factor past 2^24 (or below 1) and a LongRoPE list of the wrong length, which ``patch`` refuses, are refused
    here too, naming the file, rather than called ok."""
    config = json.loads(_LLAMA % rope)
    config.update(hidden_size=64, num_attention_heads=4)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hf-posenc check: error: {path}: its RoPE keys are malformed") and message in err, err
    assert err.count("\n") == 1
