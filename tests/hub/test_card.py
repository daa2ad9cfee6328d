"""Model cards: metadata, model-index and eval table, rendered without any server."""

from __future__ import annotations

import json
import math
import re

import pytest
from helpers import BASE_PPL, YARN_PPL, write_results
from huggingface_hub import ModelCard
from huggingface_hub.repocard_data import model_index_to_eval_results
from tiny_models import make_tiny

import hf_posenc
from hf_posenc.hub.card import load_eval_table, load_lm_eval_table, public_results, render_card
from hf_posenc.hub.provenance import different_models
from hf_posenc.record import PatchRecord
from hf_posenc.spec import NONE_METHOD as NONE


def yarn_model():
    model = make_tiny("llama")
    return hf_posenc.patch(model, "yarn", factor=4, original_max_position_embeddings=64)


def test_card_metadata_table_and_model_index(tmp_path):
    model = yarn_model()
    results = write_results(tmp_path, {"yarn:factor=4": YARN_PPL, "none": BASE_PPL, "pi:factor=4": {512: 99.0}})
    record = PatchRecord.from_config(model.config)
    card = render_card(
        model.config,
        repo_id="me/tiny-yarn",
        base_model="org/tiny",
        base_revision="a" * 40,
        config_only=True,
        license_info={"license": "apache-2.0"},
        eval_table=load_eval_table(results, record),
    )
    parsed = ModelCard(str(card))  # what the Hub and ModelCard.load read back
    assert parsed.data.base_model == "org/tiny"
    assert parsed.data.license == "apache-2.0"
    assert {"hf-posenc", "rope-scaling", "long-context", "yarn"} <= set(parsed.data.tags)
    assert "alibi" not in parsed.data.tags
    by_length = {r.metric_args["context_length"]: r.metric_value for r in parsed.data.eval_results}
    assert by_length == YARN_PPL  # the method's rows only, never the base's or another method's
    assert {r.metric_type for r in parsed.data.eval_results} == {"perplexity"}
    assert {r.dataset_type for r in parsed.data.eval_results} == {"pg19"}
    name, from_index = model_index_to_eval_results(parsed.data.to_dict()["model-index"])
    assert name == "me/tiny-yarn" and len(from_index) == 3

    text = parsed.text
    assert "| 512 | 23.90 | 25.81 |" in text
    assert "| 2048 | 25.10 | — |" in text and "| 4096 | — | 26.63 |" in text
    assert "99.00" not in text
    assert "![Perplexity vs context length](ppl_vs_length.png)" in text
    assert 'hf_posenc.from_pretrained("me/tiny-yarn")' in text
    assert "https://arxiv.org/abs/2309.00071" in text
    assert f'revision="{"a" * 40}"' in text  # native: the transformers-only snippet pins the base commit


@pytest.mark.parametrize(("bos", "said"), [(True, "BOS prepended"), (False, "no BOS"), (None, None)])
def test_the_card_says_whether_windows_began_with_bos(tmp_path, bos, said):
    """A run with BOS and one without give other numbers: the table's line and model-index's metric_args say which
    (background.md: always name BOS). A file that does not record it says nothing of it."""
    model = yarn_model()
    details = {} if bos is None else {"protocol_details": {"bos": bos}}
    results = write_results(tmp_path, {"yarn:factor=4": YARN_PPL, "none": BASE_PPL}, **details)
    card = render_card(
        model.config, repo_id="me/tiny-yarn", base_model="org/tiny", base_revision="a" * 40, config_only=True,
        license_info={"license": "apache-2.0"}, eval_table=load_eval_table(results, PatchRecord.from_config(model.config)),
    )  # fmt: skip
    parsed = ModelCard(str(card))
    line = next(line for line in parsed.text.splitlines() if line.startswith("Perplexity ("))
    expected = f"sliding-window protocol, {said}, token-weighted mean" if said else "sliding-window protocol, token"
    assert expected in line
    assert {r.metric_args.get("bos") for r in parsed.data.eval_results} == {bos}


def test_results_measured_with_other_resolved_parameters_are_refused(tmp_path):
    """``yarn:factor=4`` on a model trained on 8192 tokens is not this patch (trained context 64)."""
    model = yarn_model()
    record = PatchRecord.from_config(model.config)
    own = write_results(tmp_path, {"yarn:factor=4": YARN_PPL}, params=dict(record.params))
    assert load_eval_table(own, record).rows[0] == (512, None, 25.81)
    other = {**record.params, "original_max_position_embeddings": 8192}
    write_results(tmp_path, {"yarn:factor=4": YARN_PPL}, params=other)
    with pytest.raises(ValueError, match="original_max_position_embeddings=8192 there, 64 here"):
        load_eval_table(own, record)


@pytest.mark.parametrize("params", ["missing", None, {}])
def test_rows_that_record_no_parameters_are_no_match(tmp_path, params):
    """A hand-made or older results file whose rows of the method record no resolved parameters: nothing shows they
    were measured with this patch's (trained context 64, not 8192, say), so they are refused, not taken as matching;
    the base's rows (``none``: no parameters) need none."""
    record = PatchRecord.from_config(yarn_model().config)
    path = write_results(tmp_path, {"yarn:factor=4": YARN_PPL, "none": BASE_PPL})
    data = json.loads(path.read_text())
    for row in data["results"]:
        if row["method"] != "none":
            row.pop("params") if params == "missing" else row.update(params=params)
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"records no parameters for its 'yarn:factor=4' rows"):
        load_eval_table(path, record)


@pytest.mark.parametrize("kept", [{"backend": "eager"}, {"rope_theta": 10000.0}, "all but factor"])
def test_rows_that_lack_some_resolved_parameters_are_no_match(tmp_path, kept):
    """Rows whose ``params`` hold only the backend, only keys the patch does not have, or not all of its resolved
    parameters show no more than rows with none: refused, naming what is missing."""
    record = PatchRecord.from_config(yarn_model().config)
    partial = {key: value for key, value in record.params.items() if key != "factor"}
    path = write_results(tmp_path, {"yarn:factor=4": YARN_PPL}, params=partial if kept == "all but factor" else kept)
    missing = "factor" if kept == "all but factor" else "attention_factor, beta_fast"
    with pytest.raises(ValueError, match=rf"records no {missing}\b.* for its 'yarn:factor=4' rows"):
        load_eval_table(path, record)


def _cells(line: str) -> list[str]:
    """The cells of a markdown table row: split at each ``|`` not escaped."""
    return re.split(r"(?<!\\)\|", line)[1:-1]


def test_names_from_results_files_are_literal_text_in_the_card(tmp_path):
    """A task, metric, dataset or version string holding ``|``, a newline or backticks (a hand-made or foreign file)
    keeps the card's tables whole, one row per task and metric with its cells, and its inline code closed."""
    model = yarn_model()
    record = PatchRecord.from_config(model.config)
    task, metric = "a|b\nc", "acc`x`|y"
    runs = [(NONE, {}, 0.5), ("yarn:factor=4", dict(record.params), 0.25)]
    lm_eval = {
        "model": "org/tiny",
        "lm_eval_version": "0.4\n## Injected",
        "max_length": 64,
        "runs": [{"method": m, "params": p, "results": {task: {f"{metric},none": v}}} for m, p, v in runs],
    }
    (tmp_path / "lm_eval.json").write_text(json.dumps(lm_eval))
    dataset = "org/pg`19|\n\nx"
    results = write_results(
        tmp_path, {"yarn:factor=4": YARN_PPL, "none": BASE_PPL}, dataset=dataset, dataset_details={"local": False}
    )
    card = render_card(
        model.config, repo_id="me/x", base_model="org/tiny", base_revision=None, config_only=True,
        eval_table=load_eval_table(results, record), lm_eval_table=load_lm_eval_table(tmp_path / "lm_eval.json", record),
    )  # fmt: skip
    text = ModelCard(str(card)).text
    scores = [line for line in text.split("## lm-evaluation-harness")[1].splitlines() if line.startswith("|")]
    assert [len(_cells(line)) for line in scores] == [4, 4, 4]
    assert _cells(scores[2]) == [r" a\|b c ", r" acc\`x\`\|y ", " 0.5000 ", " 0.2500 "]
    perplexity = [line for line in text.split("## Evaluation")[1].split("##")[0].splitlines() if line.startswith("|")]
    assert [len(_cells(line)) for line in perplexity] == [3] * (2 + len(YARN_PPL | BASE_PPL))
    assert "token-weighted mean) on ``org/pg`19|  x``; lower is better" in text
    assert "lm-evaluation-harness) 0.4 ## Injected (" in text  # in its sentence, not a heading of its own


DEEP = "[" * 100_000 + "]" * 100_000  # nested past the JSON parser's recursion limit


@pytest.mark.parametrize("content", ["[1, 2]", "not json", '{"protocol": "x"}', DEEP])
def test_a_file_that_is_not_eval_results_is_a_clear_error(tmp_path, content):
    path = tmp_path / "results.json"
    path.write_text(content)
    record = PatchRecord.from_config(yarn_model().config)
    with pytest.raises(ValueError, match=f"{path}"):
        load_eval_table(path, record)
    with pytest.raises(ValueError, match=f"{path}"):
        load_lm_eval_table(path, record)


def test_card_without_results_or_license_has_no_model_index():
    card = ModelCard(
        str(
            render_card(
                yarn_model().config, repo_id="me/x", base_model="org/tiny", base_revision=None, config_only=False
            )
        )
    )
    assert card.data.eval_results is None and card.data.license is None
    assert "model-index" not in card.data.to_dict()
    assert "## Evaluation" not in card.text
    assert "holds the full model" in card.text


@pytest.mark.parametrize("config_only", [True, False])
def test_the_native_snippet_imports_what_it_uses(config_only):
    """A config-only repo's snippet builds the base with the repo's config (AutoConfig); one holding the weights
    loads it whole, and imports no AutoConfig it would not use."""
    text = str(
        render_card(
            yarn_model().config, repo_id="me/x", base_model="org/tiny", base_revision=None, config_only=config_only
        )
    )
    imports = "from transformers import AutoConfig, AutoModelForCausalLM"
    assert (imports in text) is config_only and ("config=AutoConfig.from_pretrained" in text) is config_only
    assert config_only or "from transformers import AutoModelForCausalLM\n" in text


def test_non_native_method_card_says_it_needs_hf_posenc():
    model = hf_posenc.patch(make_tiny("llama"), "dynamic-yarn", original_max_position_embeddings=64)
    text = str(render_card(model.config, repo_id="me/x", base_model="org/tiny", base_revision=None, config_only=True))
    assert "transformers cannot express this method" in text
    assert "AutoConfig" not in text


@pytest.mark.parametrize("spec", ["linear:factor=4", "pi:factor=4.0,original_max_position_embeddings=64"])
def test_result_rows_match_aliases_and_resolved_params(tmp_path, spec):
    model = hf_posenc.patch(make_tiny("llama"), "pi", factor=4, original_max_position_embeddings=64)
    results = write_results(tmp_path, {spec: {512: 150.0}, "pi:factor=2": {512: 60.0}, "none": BASE_PPL})
    table = load_eval_table(results, PatchRecord.from_config(model.config))
    assert table.method_spec == spec
    assert {row["method"] for row in table.results} == {spec, "none"}  # what the pushed plot shows
    assert [(length, ppl) for length, _, ppl in table.rows if ppl is not None] == [(512, 150.0)]


def test_model_index_holds_finite_perplexities_on_hub_datasets_only(tmp_path):
    """inf / NaN are no metric values, and a local folder's name is no dataset id; the table shows them all."""
    record = PatchRecord.from_config(yarn_model().config)
    rows = {"yarn:factor=4": {512: 25.81, 1024: math.inf, 2048: math.nan}, "none": BASE_PPL}
    table = load_eval_table(write_results(tmp_path, rows), record)
    assert [(r.metric_args["context_length"], r.metric_value) for r in table.eval_results()] == [(512, 25.81)]
    text = str(render_card(yarn_model().config, repo_id="me/x", base_model=None, base_revision=None, config_only=False, eval_table=table))  # fmt: skip
    assert "| 1024 | 25.70 | inf |" in text and "| 2048 | 25.10 | nan |" in text
    local = [{"name": "org/texts", "local": True}]  # recorded by the eval; a file without it: read from the name
    local += [
        {"name": name} for name in (str(tmp_path / "texts"), "./texts", "~/texts", "data/pg19/texts", "x/texts.jsonl")
    ]
    for details in local:
        table = load_eval_table(write_results(tmp_path, rows, dataset="me/texts", dataset_details=details), record)
        assert table.eval_results() == [] and table.dataset == "texts", details
    card = render_card(yarn_model().config, repo_id="me/x", base_model=None, base_revision=None, config_only=False, eval_table=table)  # fmt: skip
    assert "model-index" not in ModelCard(str(card)).data.to_dict()  # not even an empty one


def test_pushed_results_name_no_local_path():
    record = {
        "model": "/home/alice/models/tiny",
        "model_details": {"name": "/home/alice/models/tiny", "gguf_file": None, "dtype": "float32"},
        "dataset": "org/pg19",
        "arguments": {"model": "~/models/tiny", "dataset": {"name": "../alice/texts", "join": "/"}},
        "protocol_details": {"note": "/ablation: 2 GPUs"},
        "results": [{"method": "none", "ppl": 25.0}],
    }
    assert public_results(record) == {
        "model": "tiny",
        "model_details": {"name": "tiny", "gguf_file": None, "dtype": "float32"},
        "dataset": "org/pg19",
        "arguments": {"model": "tiny", "dataset": {"name": "texts", "join": "/"}},
        "protocol_details": {"note": "/ablation: 2 GPUs"},  # text, not a path
        "results": [{"method": "none", "ppl": 25.0}],
    }


def test_pushed_lm_eval_results_name_no_local_path_and_no_secret():
    """lm-eval's arguments: the task folder, the model folder lm-eval's metadata names and a tokenizer path cut to
    their names; a token in model_args or metadata, or shaped like one anywhere, redacted. Token counts stay."""
    record = {
        "arguments": {
            "include_path": "/home/alice/tasks",
            "model_args": {
                "token": "hf_SecretTokenValue1234567890",
                "tokenizer": "/home/alice/tok",
                "dtype": "float32",
            },
            "metadata": {"pretrained": "/home/alice/models/tiny", "HF_TOKEN": "x", "note": "by hf_AnotherSecret12345"},
        },
        "results": [{"method": "none", "tokens": 2047}],
    }
    assert public_results(record) == {
        "arguments": {
            "include_path": "tasks",
            "model_args": {"token": "***", "tokenizer": "tok", "dtype": "float32"},
            "metadata": {"pretrained": "tiny", "HF_TOKEN": "***", "note": "by ***"},
        },
        "results": [{"method": "none", "tokens": 2047}],
    }


def test_results_without_the_pushed_method_raise(tmp_path):
    results = write_results(tmp_path, {"yarn:factor=8": YARN_PPL, "none": BASE_PPL})
    with pytest.raises(ValueError, match=r"no rows of the pushed method .*'yarn:factor=8'"):
        load_eval_table(results, PatchRecord.from_config(yarn_model().config))


def test_results_with_two_matching_specs_raise(tmp_path):
    results = write_results(tmp_path, {"yarn:factor=4": YARN_PPL, "yarn:factor=4,beta_fast=32": YARN_PPL})
    with pytest.raises(ValueError, match="several rows"):
        load_eval_table(results, PatchRecord.from_config(yarn_model().config))


def test_unpatched_model_has_no_card():
    with pytest.raises(ValueError, match="not patched by hf_posenc"):
        render_card(make_tiny("llama").config, repo_id="me/x", base_model=None, base_revision=None, config_only=True)


def test_results_of_another_model_are_told_apart_by_hub_id_or_folder(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    assert different_models("org/model-a", "org/model-b") and not different_models("org/model-a", "org/model-a")
    assert different_models(str(first), str(second))
    assert not different_models(str(first), str(tmp_path / "second" / ".." / "first"))  # one folder, two spellings
    assert not different_models("org/model-a", str(first))  # a Hub id against a folder: cannot tell


@pytest.mark.parametrize(("method", "params"), [("dynamic-ntk", {"factor": 4}), ("yarn", {"factor": 4}), ("alibi", {})])
def test_the_serving_table_is_hf_posenc_checks_verdict(method, params):
    """The card's "Serving engines" table has one row per engine, each the finding ``hf-posenc check`` gives for
    this config (the same data, ``hf_posenc.serving.engines``): dynamic NTK differs in vLLM, SGLang and TGI and is ignored
    by llama.cpp; ALiBi, hf_posenc's own rope type, is refused by every engine but llama.cpp's converter, which
    writes plain RoPE (the card says so: the failure a reader of the card must know of)."""
    from hf_posenc.serving.engines import engine_findings

    model = hf_posenc.patch(make_tiny("llama"), method, **params)
    text = str(render_card(model.config, repo_id="me/x", base_model="org/tiny", base_revision=None, config_only=True))
    table = text.split("## Serving engines", 1)[1]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and not line.startswith("| E")]
    findings = engine_findings(model.config.to_dict())
    assert [(row[0].removeprefix("| "), row[1]) for row in rows] == [(f.engine, f.severity) for f in findings]
    assert [row[2].removesuffix(" |") for row in rows] == [f.message.replace("|", "/") for f in findings]
    verdicts = {f.engine: f.severity for f in findings}
    if method == "dynamic-ntk":
        assert verdicts == {"vllm": "differs", "sglang": "differs", "llama.cpp": "ignored", "tgi": "differs"}
    if method == "alibi":
        assert verdicts == {"vllm": "refused", "sglang": "refused", "llama.cpp": "ignored", "tgi": "refused"}


def test_a_card_with_a_t5_tables_weights_says_llama_cpp_refuses_them():
    """Pushed with its weights, a T5-bias model's table has no GGUF name: llama.cpp's converter refuses it (the card's
    row says so); config-only, llama.cpp builds plain RoPE from the base's weights."""
    model = hf_posenc.patch(make_tiny("llama"), "t5-bias")

    def llama_cpp_row(config_only: bool) -> str:
        card = render_card(
            model.config, repo_id="me/x", base_model="org/tiny", base_revision=None, config_only=config_only,
            added_tensors=not config_only,
        )  # fmt: skip
        return next(line for line in str(card).splitlines() if line.startswith("| llama.cpp |"))

    assert llama_cpp_row(False).startswith("| llama.cpp | refused | its converter has no GGUF name for the tensors")
    assert llama_cpp_row(True).startswith("| llama.cpp | ignored |")


@pytest.mark.parametrize(
    ("revision", "command"),
    [
        (None, "`hf-posenc check me/tiny-yarn`"),
        ("main", "`hf-posenc check me/tiny-yarn`"),
        ("exp", "`hf-posenc check me/tiny-yarn --revision exp`"),
        ("a`b$(rm x)", "``hf-posenc check me/tiny-yarn --revision 'a`b$(rm x)'``"),
    ],
)
def test_the_cards_check_command_is_one_shell_command_in_one_code_span(revision, command):
    """The branch goes into the card's ``hf-posenc check`` line shell-quoted, in a code span that holds it whole: as
    it is, a backtick would end the inline code, and a shell character run in the copied command."""
    card = str(render_card(yarn_model().config, repo_id="me/tiny-yarn", base_model="org/tiny", base_revision="a" * 40,
                           config_only=True, revision=revision))  # fmt: skip
    assert f"(not run; {command} says the same" in card


def test_results_of_texts_in_memory_name_no_hub_dataset(tiny_dir, tmp_path):
    """A run on texts given as strings records them as no Hub dataset: a card made from it puts no model-index entry
    claiming a dataset named like them."""
    from hf_posenc.eval import ModelSource, PerplexityConfig, TextSource, run_perplexity

    texts = TextSource.from_texts([path.read_text() for path in sorted((tiny_dir / "texts").glob("*.txt"))])
    config = PerplexityConfig(lengths=[32], methods=["none", "yarn:factor=4"])
    run_perplexity(ModelSource(str(tiny_dir / "model")), texts, config, tmp_path)
    model = hf_posenc.patch(hf_posenc.from_pretrained(str(tiny_dir / "model")), "yarn", factor=4)
    table = load_eval_table(tmp_path / "results.json", PatchRecord.from_config(model.config))
    assert not table.hub_dataset and table.dataset == "texts"
    card = render_card(
        model.config, repo_id="me/tiny-yarn", base_model="org/tiny", base_revision="a" * 40, config_only=True,
        license_info={"license": "apache-2.0"}, eval_table=table,
    )  # fmt: skip
    assert not ModelCard(str(card)).data.eval_results
