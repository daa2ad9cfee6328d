"""Every option of the commands that load a model or data, given a value it cannot take: one line on stderr, exit
status 2, and neither a model, a tokenizer nor a dataset loaded, nothing written (the errors come before slow work).
"""

from __future__ import annotations

import shutil

import pytest
import transformers
from tiny_runs import folder_files
from tokenizers import processors

from hf_posenc.cli import main
from hf_posenc.cli import train as train_command
from hf_posenc.eval import data, runner


@pytest.fixture
def nothing_loads(monkeypatch):
    """Any load of a model, a tokenizer or texts fails the test (reading a config is not slow work)."""

    def refuse(*args, **kwargs):
        raise AssertionError("loaded before the arguments were checked")

    for auto in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        monkeypatch.setattr(auto, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(refuse))
    for module in (data, runner, train_command):
        monkeypatch.setattr(module, "load_texts", refuse)


EVAL = [
    (["--lengths", "0"], "--lengths"),
    (["--lengths", "-8"], "--lengths"),
    (["--lengths", "abc"], "--lengths"),
    (["--lengths", "99999999999"], "--lengths"),
    (["--lengths", "32", "--batch-size", "0"], "--batch-size"),
    (["--lengths", "32", "--chunk-size", "0"], "--chunk-size"),
    (["--lengths", "32", "--sequence-slice", "255"], "--sequence-slice"),
    (["--lengths", "32", "--max-windows", "0"], "--max-windows"),
    (["--lengths", "32", "--max-documents", "0"], "--max-documents"),
    (["--lengths", "32", "--protocol", "sliding", "--stride", "0"], "--stride"),
    (
        ["--lengths", "32,64", "--protocol", "sliding", "--stride", "48"],
        "--stride 48 must be at most the shortest length, 32",
    ),
    (
        ["--lengths", "32,64", "--protocol", "sliding", "--stride", "32", "--bos", "prepend"],
        "--stride 32 must be at most the 31 text tokens after BOS of the shortest length",
    ),
    (["--lengths", "32", "--method", "dynamic-ntk+self-extend:factor=2"], "changes the frequencies with the length"),
    (["--lengths", "32", "--method", "string:shifted_offset=0"], "shifted_offset must be a positive integer"),
    (["--lengths", "32", "--method", "leaky-rerope:k=0.5"], "k must be a number from 1 (RoPE itself) to 2^24"),
    (["--lengths", "32", "--method", "rerope", "--attn-implementation", "flash_attention_2"], "flash_attention_2"),
    (["--lengths", "32", "--max-memory", "0=70GiB"], "--max-memory"),
]
PASSKEY = [
    (["--lengths", "0"], "--lengths"),
    (["--lengths", "400", "--depths", "1.5"], "--depths"),
    (["--lengths", "400", "--depths", "-0.1"], "--depths"),
    (["--lengths", "400", "--depths", "nan"], "--depths"),
    (["--lengths", "400", "--trials", "0"], "--trials"),
    (["--lengths", "400", "--sequence-slice", "x"], "--sequence-slice"),
    (["--lengths", "400", "--method", "self-extend:group_size=0"], "group_size"),
]
TRAIN = [
    (["--length", "0"], "--length"),
    (["--steps", "0"], "--steps"),
    (["--batch-size", "0"], "--batch-size"),
    (["--learning-rate", "-1"], "--learning-rate"),
    (["--learning-rate", "nan"], "--learning-rate"),
    (["--position-learning-rate", "0"], "--position-learning-rate"),
    (["--gradient-accumulation-steps", "0"], "--gradient-accumulation-steps"),
    (["--warmup-steps", "-1"], "--warmup-steps"),
    (["--save-steps", "0"], "--save-steps"),
    (["--max-documents", "0"], "--max-documents"),
    (["--trainable", "lora", "--lora-rank", "0"], "--lora-rank"),
    (["--trainable", "lora", "--lora-alpha", "-2"], "--lora-alpha"),
    (["--lora-rank", "4"], "--lora-rank"),
    (["--method", "yarn:fctor=2"], "Unknown parameter(s) 'fctor'"),
]


def _status(argv: list[str]) -> int:
    """``main``'s exit status (argparse's own errors exit, the command's return)."""
    try:
        return main(argv)
    except SystemExit as exit:
        return exit.code


def _refused(argv: list[str], expected: str, capsys, output) -> None:
    before = folder_files(output.parent)
    assert _status(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err
    assert folder_files(output.parent) == before


@pytest.mark.parametrize(("extra", "expected"), EVAL, ids=[" ".join(case[0]) for case in EVAL])
def test_eval_refuses_before_loading(tiny_dir, tmp_path, capsys, nothing_loads, extra, expected):
    output = tmp_path / "out"
    argv = ["eval", "--model", str(tiny_dir / "model"), "--dataset", str(tiny_dir / "texts"), "--output", str(output)]
    _refused([*argv, *extra], expected, capsys, output)


@pytest.mark.parametrize(("extra", "expected"), PASSKEY, ids=[" ".join(case[0]) for case in PASSKEY])
def test_passkey_refuses_before_loading(tiny_dir, tmp_path, capsys, nothing_loads, extra, expected):
    output = tmp_path / "out"
    _refused(["passkey", "--model", str(tiny_dir / "model"), "--output", str(output), *extra], expected, capsys, output)


@pytest.mark.parametrize(("extra", "expected"), TRAIN, ids=[" ".join(case[0]) for case in TRAIN])
def test_train_refuses_before_loading(tiny_dir, tmp_path, capsys, nothing_loads, extra, expected):
    output = tmp_path / "out"
    argv = ["train", "--model", str(tiny_dir / "model"), "--dataset", str(tiny_dir / "texts"), "--output", str(output)]
    _refused([*argv, "--method", "yarn:factor=2", "--length", "32", "--steps", "2", *extra], expected, capsys, output)


@pytest.mark.parametrize("command", ["eval", "passkey", "train"])
def test_an_output_that_is_a_file_is_refused_before_loading(tiny_dir, tmp_path, capsys, nothing_loads, command):
    output = tmp_path / "taken"
    output.write_text("mine")
    argv = [command, "--model", str(tiny_dir / "model"), "--output", str(output)]
    if command != "passkey":
        argv += ["--dataset", str(tiny_dir / "texts")]
    argv += {
        "eval": ["--lengths", "32"],
        "passkey": ["--lengths", "400"],
        "train": ["--method", "yarn:factor=2", "--length", "32", "--steps", "2"],
    }[command]
    _refused(argv, str(output), capsys, output)
    assert output.read_text() == "mine"


def test_a_stride_past_the_text_after_the_bos_its_tokenizer_adds_is_refused_before_the_data(
    tiny_dir, tmp_path, capsys, monkeypatch
):
    """``--bos auto`` with a tokenizer that adds BOS: known once the tokenizer is read, before the texts or the
    model are."""
    folder = tmp_path / "models" / "bos"
    shutil.copytree(tiny_dir / "model", folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tokenizer.bos_token_id)]
    )
    tokenizer.save_pretrained(folder)
    assert transformers.AutoTokenizer.from_pretrained(folder)("ab").input_ids[0] == tokenizer.bos_token_id

    def refuse(*args, **kwargs):
        raise AssertionError("read before the stride was checked")

    monkeypatch.setattr(runner, "load_texts", refuse)
    monkeypatch.setattr(runner, "load_model_at_commit", refuse)
    (tmp_path / "run").mkdir()
    output = tmp_path / "run" / "out"
    argv = ["eval", "--model", str(folder), "--dataset", str(tiny_dir / "texts"), "--output", str(output)]
    _refused(
        [*argv, "--lengths", "32", "--protocol", "sliding", "--stride", "32"], "the 31 text tokens", capsys, output
    )
