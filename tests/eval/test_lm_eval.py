"""lm-evaluation-harness on patched models (:mod:`hf_posenc.eval.harness`) and its scores in the model card, on a tiny
model saved to disk and two local tasks: every number compared with lm-eval run directly."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from lm_eval_tasks import TASKS, write_tasks
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_posenc
from hf_posenc.eval import LmEvalConfig, LmEvalReport, ModelSource, run_lm_eval
from hf_posenc.hub.push import build_card
from hf_posenc.reports.tasks import LM_EVAL_JSON

lm_eval = pytest.importorskip("lm_eval")
from lm_eval.models.huggingface import HFLM  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

pytestmark = pytest.mark.xdist_group("lm-eval-run")  # its module fixtures are built once, on one worker

METHODS = ["none", "yarn:factor=4"]


@pytest.fixture(scope="module")
def task_manager(tmp_path_factory) -> TaskManager:
    """The two local tasks only (lm-eval's own ~6 s index of its built-in tasks is not needed here)."""
    return TaskManager(include_path=str(write_tasks(tmp_path_factory.mktemp("tasks"))), include_defaults=False)


@pytest.fixture(scope="module")
def run(tiny_dir, task_manager, tmp_path_factory, one_thread):
    """``run_lm_eval`` on the saved tiny model (loaded from its folder), unpatched and YaRN x4: (report, folder)."""
    output = tmp_path_factory.mktemp("lm_eval")
    config = LmEvalConfig(TASKS, methods=METHODS, evaluate={"bootstrap_iters": 0})
    report = run_lm_eval(ModelSource(str(tiny_dir / "model")), config, output, task_manager=task_manager)
    return report, output


def _direct(model, tokenizer, task_manager, max_length: int) -> dict:
    """lm-eval itself on ``model`` as it is: its metrics per task."""
    lm = HFLM(pretrained=model, tokenizer=tokenizer, max_length=max_length)
    results = lm_eval.simple_evaluate(
        model=lm, tasks=list(TASKS), task_manager=task_manager, bootstrap_iters=0, log_samples=False
    )
    return {task: {k: v for k, v in values.items() if "," in k} for task, values in results["results"].items()}


def _scores(results: dict) -> dict:
    """The numeric metrics (standard errors aside, which lm-eval reports as 'N/A' without bootstrap)."""
    return {task: {k: v for k, v in values.items() if "_stderr," not in k} for task, values in results.items()}


def test_each_method_is_lm_eval_on_the_model_patched_so(run, tiny_dir, task_manager, one_thread):
    report, _ = run
    assert [r.method for r in report.runs] == METHODS
    assert report.max_length == 4 * 64  # yarn x4's context, for none too: no input cut to the 64 trained
    model = AutoModelForCausalLM.from_pretrained(tiny_dir / "model").eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir / "model")
    unpatched = _scores(_direct(model, tokenizer, task_manager, 256))
    with hf_posenc.patched(model, "yarn", factor=4):
        yarn = _scores(_direct(model, tokenizer, task_manager, 256))
    assert _scores(report.runs[0].results) == unpatched
    assert _scores(report.runs[1].results) == yarn
    assert yarn["tiny_ppl"]["word_perplexity,none"] != unpatched["tiny_ppl"]["word_perplexity,none"]
    assert yarn["tiny_ppl"]["bits_per_byte,none"] != unpatched["tiny_ppl"]["bits_per_byte,none"]


def test_the_results_file_is_standard_json_with_the_resolved_method(run):
    report, output = run
    text = (output / LM_EVAL_JSON).read_text()
    written = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in {LM_EVAL_JSON}"))
    assert written == report.to_json() and LmEvalReport.read(output / LM_EVAL_JSON) == report
    assert written["lm_eval_version"] == lm_eval.__version__
    none, yarn = written["runs"]
    assert (
        none["params"] == {}
        and yarn["params"]["factor"] == 4
        and yarn["params"]["original_max_position_embeddings"] == 64
    )
    assert yarn["configs"] == sorted(TASKS) and yarn["versions"] == {"tiny_choice": 1.0, "tiny_ppl": 1.0}
    assert none["results"]["tiny_ppl"]["word_perplexity_stderr,none"] is None  # lm-eval's 'N/A'
    lines = report.table().splitlines()
    assert lines[0].split() == ["task", "metric", *METHODS]
    acc = [line.split() for line in lines if line.startswith("tiny_choice")]
    assert acc == [
        ["tiny_choice", "acc,none", *(f"{r['results']['tiny_choice']['acc,none']:.4f}" for r in (none, yarn))]
    ]


def test_a_loaded_model_is_given_back_unpatched(tiny_dir, task_manager, one_thread):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir / "model").eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir / "model")
    ids = torch.tensor([list(range(2, 90))])
    with torch.no_grad():
        before = model(ids).logits
    evaluate = {"limit": 2, "bootstrap_iters": 0}
    config = LmEvalConfig(["tiny_choice"], methods=["dynamic-ntk:factor=4"], max_length=128, evaluate=evaluate)
    report = run_lm_eval(model, config, tokenizer=tokenizer, task_manager=task_manager)
    assert report.max_length == 128 and report.runs[0].params["factor"] == 4
    assert hf_posenc.get_patch(model) is None
    # lm-eval's own spelling, in model_args: the same length, run and reported
    config = LmEvalConfig(["tiny_choice"], methods=["none"], model_args={"max_length": 100}, evaluate=evaluate)
    spelled = run_lm_eval(model, config, tokenizer=tokenizer, task_manager=task_manager)
    assert spelled.max_length == 100 and "max_length" not in spelled.arguments["model_args"]
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)


def test_a_generation_task_is_lm_eval_on_the_model_patched_so(tiny_dir, task_manager, one_thread):
    """``generate_until`` (how RULER and NIAH score) runs on each method through the model handed to HFLM and
    scores as lm-eval itself does on the model patched the same way. (The tiny random model's greedy generations
    are the same few characters with and without YaRN, so this shows the path, not a difference between methods;
    the rolling-loglikelihood test above shows that.)"""
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir / "model")
    tokenizer.eos_token = "."  # lm-eval's generation stops at an end-of-text token; the tiny tokenizer has none
    config = LmEvalConfig(["tiny_generate"], methods=METHODS, evaluate={"bootstrap_iters": 0})
    report = run_lm_eval(ModelSource(str(tiny_dir / "model")), config, tokenizer=tokenizer, task_manager=task_manager)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir / "model").eval()

    def generations(settings_model) -> tuple[list[str], dict]:
        lm = HFLM(pretrained=settings_model, tokenizer=tokenizer, max_length=256)
        done = lm_eval.simple_evaluate(
            model=lm, tasks=["tiny_generate"], task_manager=task_manager, bootstrap_iters=0, log_samples=True
        )
        metrics = {task: {k: v for k, v in values.items() if "," in k} for task, values in done["results"].items()}
        return [sample["resps"][0][0] for sample in done["samples"]["tiny_generate"]], metrics

    unpatched, unpatched_results = generations(model)
    with hf_posenc.patched(model, "yarn", factor=4):
        yarn, yarn_results = generations(model)
    assert _scores(report.runs[0].results) == _scores(unpatched_results)
    assert _scores(report.runs[1].results) == _scores(yarn_results)
    assert len(unpatched) == len(yarn) == 4 and all(unpatched)


def test_the_model_is_loaded_as_asked_and_loading_model_args_are_refused(run, tiny_dir, task_manager, one_thread):
    """``attn_implementation`` (like revision and device_map) loads the named model as ``hf-posenc eval`` does:
    eager attention gives the sdpa run's scores, and the report says which ran. HFLM's own loading arguments, which
    it ignores for a model handed to it, and loading parameters beside a loaded model are refused before any task."""
    report, _ = run
    source = ModelSource(str(tiny_dir / "model"), attn_implementation="eager")
    config = LmEvalConfig(TASKS, methods=METHODS, evaluate={"bootstrap_iters": 0})
    eager = run_lm_eval(source, config, task_manager=task_manager)
    assert eager.model_details["attn_implementation"] == "eager"
    assert "attn_implementation" not in report.model_details
    for ours, theirs in zip(eager.runs, report.runs, strict=True):
        for task, values in _scores(ours.results).items():
            for metric, value in values.items():
                assert value == pytest.approx(_scores(theirs.results)[task][metric], rel=1e-5), (task, metric)
    for model_args, advice in [
        ({"revision": "main"}, "give `revision`"),
        ({"parallelize": True}, "give `device_map`"),
        ({"dtype": "float16"}, "give `dtype`"),
        ({"peft": "me/adapter"}, "hf_posenc patches the base model; merge an adapter"),
    ]:
        with pytest.raises(ValueError, match=f"lm-eval ignores it for the model hf_posenc hands it: {advice}"):
            LmEvalConfig(TASKS, model_args=model_args)
    with pytest.raises(TypeError, match=r"give ModelSource\('me/model'\) \(and how to load it\), or a model"):
        run_lm_eval("me/model", LmEvalConfig(TASKS), task_manager=task_manager)
    with pytest.raises(ValueError, match=r"`revision` names a commit of a Hub repo"):
        ModelSource(str(tiny_dir / "model"), revision="main")


def test_a_saved_patched_model_is_its_base_and_its_method(run, tiny_dir, task_manager, tmp_path, one_thread):
    """A folder saved after ``patch``: loaded as ``hf-posenc eval`` loads it, ``none`` is its base (the tiny model) and
    its saved method the default second one: the same scores as the tiny model unpatched and patched."""
    saved = tmp_path / "saved"
    hf_posenc.patch(AutoModelForCausalLM.from_pretrained(tiny_dir / "model"), "yarn", factor=4).save_pretrained(saved)
    AutoTokenizer.from_pretrained(tiny_dir / "model").save_pretrained(saved)
    report = run_lm_eval(
        ModelSource(str(saved)), LmEvalConfig(TASKS, evaluate={"bootstrap_iters": 0}), task_manager=task_manager
    )
    assert [r.method for r in report.runs][0] == "none" and report.runs[1].params["factor"] == 4
    assert report.model_details["saved_patch"] == report.runs[1].method
    assert [r.results for r in report.runs] == [r.results for r in run[0].runs]


def _card_rows(card: str) -> list[str]:
    """The rows of the card's lm-evaluation-harness table."""
    section = card.split("## lm-evaluation-harness", 1)[1]
    return [line for line in section.splitlines() if line.startswith("| tiny_")]


def test_the_card_shows_exactly_the_scores_of_the_file(run, tiny_dir):
    report, output = run
    folder = str(tiny_dir / "model")
    model = hf_posenc.patch(AutoModelForCausalLM.from_pretrained(folder), "yarn", factor=4)
    card = str(build_card(model, "me/tiny-yarn", lm_eval_results=output / LM_EVAL_JSON, with_weights=True))
    none, yarn = (run.results for run in report.runs)
    expected = [
        f"| {task} | {key.removesuffix(',none')} | {none[task][key]:.4f} | {value:.4f} |"
        for task, values in yarn.items()
        for key, value in values.items()
        if "_stderr," not in key
    ]
    assert _card_rows(card) == expected and len(expected) == 3
    assert (
        "| Task | Metric | none | yarn:factor=4 |" in card and f"lm-evaluation-harness) {lm_eval.__version__}" in card
    )


@pytest.mark.parametrize(
    ("method", "params", "message"),
    [
        ("pi", {"factor": 4}, "no lm-eval runs of the pushed method 'pi:"),
        ("yarn", {"factor": 8}, "no lm-eval runs of the pushed method 'yarn:"),  # the same method, another factor
        ("yarn", {"factor": 4, "beta_fast": 16}, "measured 'yarn:factor=4' with other parameters"),
    ],
)
def test_the_card_refuses_results_of_another_method(run, tiny_dir, method, params, message):
    _, output = run
    model = hf_posenc.patch(AutoModelForCausalLM.from_pretrained(tiny_dir / "model"), method, **params)
    with pytest.raises(ValueError, match=message):
        build_card(model, "me/tiny", lm_eval_results=output / LM_EVAL_JSON, with_weights=True)


def test_without_lm_eval_the_error_names_the_extra(monkeypatch, tiny_dir):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'hf-posenc\[lm-eval\]'"):
        run_lm_eval(ModelSource(str(tiny_dir / "model")), LmEvalConfig(["tiny_choice"]))


def test_gpt2_past_its_learned_table_is_refused_before_any_task_runs(tiny_dir, task_manager, tmp_path):
    """GPT-2's table has 64 rows: lm-eval at ``max_length`` 128 would index past it (a CUDA assert or an IndexError
    deep in the forward); refused naming lm-eval's own ways round it (not eval's `lengths`, which lm-eval has not, nor
    runs adding up in one `output`, which lm-eval refuses) and the methods that extend or replace the table, nothing
    written."""
    with pytest.raises(
        ValueError, match=r"`methods` 'none': GPT2LMHeadModel has a learned table of 64 positions"
    ) as info:
        config = LmEvalConfig(TASKS, methods=["none"], max_length=128)
        run_lm_eval(ModelSource(str(tiny_dir / "gpt2")), config, tmp_path, task_manager=task_manager)
    assert "Score it with `max_length` up to 64, run it alone with another `output`" in str(info.value)
    assert "`lengths`" not in str(info.value)
    assert not (tmp_path / LM_EVAL_JSON).exists()


def test_push_uploads_the_lm_eval_results_beside_the_card(run, tiny_dir, fake_hub):
    """``lm_eval.json`` lands in the repo (standard JSON, no local folder named), its scores in the card."""
    from hf_posenc.hub.push import push_to_hub

    report, output = run
    model = hf_posenc.patch(AutoModelForCausalLM.from_pretrained(tiny_dir / "model"), "yarn", factor=4)
    push_to_hub(model, "me/tiny-lm", lm_eval_results=output / LM_EVAL_JSON, with_weights=True)
    files = fake_hub.files("me/tiny-lm")

    def refuse(constant):
        raise ValueError(constant)

    pushed = json.loads(files["lm_eval.json"], parse_constant=refuse)
    assert [r["results"] for r in pushed["runs"]] == [r.results for r in report.runs]
    assert str(tiny_dir) not in files["lm_eval.json"].decode() and "| Task | Metric |" in files["README.md"].decode()


@pytest.mark.parametrize(
    ("limit", "said"),
    [
        (0.5, "Only the first 50% of each task's examples (lm-eval's `--limit 0.5`): not a full evaluation."),
        (3, "At most 3 examples per task (lm-eval's `--limit`): not a full evaluation unless a task has no more."),
        (1, "At most 1 example per task (lm-eval's `--limit`): not a full evaluation unless a task has no more."),
    ],
)
def test_the_card_says_a_limit_as_lm_eval_reads_it(run, tiny_dir, tmp_path, limit, said):
    """lm-eval's --limit below 1 is a fraction of each task's examples, not a count."""
    report, output = run
    limited = {**report.to_json(), "arguments": {**report.arguments, "limit": limit}}
    (tmp_path / LM_EVAL_JSON).write_text(json.dumps(limited))
    model = hf_posenc.patch(AutoModelForCausalLM.from_pretrained(str(tiny_dir / "model")), "yarn", factor=4)
    assert said in str(build_card(model, "me/tiny-yarn", lm_eval_results=tmp_path / LM_EVAL_JSON, with_weights=True))


def test_each_request_runs_on_the_dynamic_state_as_built(monkeypatch):
    """lm-eval sends its requests longest first through the model's forward; on a base whose own RoPE is
    transformers' ``dynamic`` type, each would run on the frequencies of the longest request (L = 64)."""
    from types import SimpleNamespace

    from tiny_models import make_tiny

    from hf_posenc.eval import harness as runner
    from hf_posenc.spec import MethodSpec

    rope = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    model, fresh = (make_tiny("llama", rope_parameters=dict(rope)) for _ in range(2))
    long, short = torch.randint(2, 97, (1, 128)), torch.randint(2, 97, (1, 100))

    def simple_evaluate(model, **settings):
        model(long)
        return model(short).logits

    harness = SimpleNamespace(
        models=SimpleNamespace(huggingface=SimpleNamespace(HFLM=lambda pretrained, **kwargs: pretrained)),
        simple_evaluate=simple_evaluate,
    )
    subject = SimpleNamespace(model=model, tokenizer=None)
    with torch.no_grad():
        logits = runner._evaluate(harness, subject, MethodSpec.parse("none"), {}, {}, {})
        assert torch.equal(logits, fresh(short).logits)
