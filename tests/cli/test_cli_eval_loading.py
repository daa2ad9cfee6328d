"""How ``hf-posenc eval`` / ``passkey`` load the model: ``--revision``, ``--attn-implementation``, ``--device-map`` and
``--max-memory``, and the combinations that cannot work (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from helpers import gpu
from hub_server import TOKEN
from huggingface_hub import HfApi
from tiny_runs import eval_args, results_of
from transformers import AutoModelForCausalLM

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.eval import models
from hf_posenc.eval.models import ModelSource, check_placement

METHODS = ["--method", "none", "--method", "yarn:factor=2", "--lengths", "32,48"]


def _ppl(output) -> dict:
    return {(row["method"], row["length"]): row["ppl"] for row in results_of(output)["results"]}


def test_attn_implementation_is_what_the_base_runs_with_and_part_of_the_results_identity(tiny_dir, tmp_path, capsys):
    eager, sdpa = tmp_path / "eager", tmp_path / "sdpa"
    assert main([*eval_args(tiny_dir, eager), *METHODS, "--attn-implementation", "eager"]) == 0
    assert main([*eval_args(tiny_dir, sdpa), *METHODS, "--attn-implementation", "sdpa"]) == 0
    report = results_of(eager)
    assert report["model_details"]["attn_implementation"] == report["arguments"]["attn_implementation"] == "eager"
    for key, value in _ppl(eager).items():  # the same math, two kernels
        assert math.isclose(value, _ppl(sdpa)[key], rel_tol=1e-5), key
    before = (eager / "results.json").read_bytes()
    capsys.readouterr()
    assert main([*eval_args(tiny_dir, eager), *METHODS, "--attn-implementation", "sdpa"]) == 2  # not a resume
    assert "attn_implementation" in capsys.readouterr().err
    assert (eager / "results.json").read_bytes() == before


def test_device_map_gives_the_same_numbers_and_is_recorded(tiny_dir, tmp_path):
    """On a CPU ``auto`` places the whole model there: the table is the one without it, to every digit; the results
    say how the model was placed, and resuming without ``--device-map`` is the same run."""
    plain, mapped = tmp_path / "plain", tmp_path / "mapped"
    assert main([*eval_args(tiny_dir, plain), *METHODS]) == 0
    assert main([*eval_args(tiny_dir, mapped), *METHODS, "--device-map", "auto", "--max-memory", "cpu=2GiB"]) == 0
    assert _ppl(mapped) == _ppl(plain)
    assert results_of(mapped)["model_details"]["device_map"] == "auto"
    assert results_of(mapped)["arguments"] == results_of(plain)["arguments"]


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--max-memory", "0=10GiB"], "--max-memory budgets the devices a --device-map"),
        (["--attn-implementation", "flash_attention_2"], "--attn-implementation 'flash_attention_2' cannot be used"),
        (["--revision", "v1"], "--revision names a commit of a Hub repo, and --model"),  # a local folder has none
        (["--gguf-file", "m.gguf"], "--gguf-file 'm.gguf' is not a file in the folder"),
    ],
)
def test_combinations_that_cannot_work_are_one_line_and_write_nothing(tiny_dir, tmp_path, capsys, extra, message):
    output = tmp_path / "out"
    assert main([*eval_args(tiny_dir, output), *METHODS, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hf-posenc eval: error:") and message in err and "\n" not in err, err
    assert not output.exists() or not any(output.iterdir())


def _saved_patched(tiny_dir, folder, method: str, **params):
    """The tiny model saved into ``folder`` patched with ``method``."""
    shutil.copytree(tiny_dir / "model", folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    hf_posenc.patch(model, method, **params)
    model.save_pretrained(folder)
    return folder


def _eval_args(tiny_dir, folder, output) -> list[str]:
    return [
        "eval",
        "--model",
        str(folder),
        "--dataset",
        str(tiny_dir / "texts"),
        "--output",
        str(output),
        "--lengths",
        "32",
    ]


def test_an_attn_implementation_a_saved_patch_cannot_run_names_only_the_ones_the_option_takes(
    tiny_dir, tmp_path, capsys
):
    """A folder saved with Self-Extend runs its own backends (``hf_posenc_extension_sdpa``, ...), which
    ``--attn-implementation`` does not take: the error offers the transformers names that pick them."""
    folder = _saved_patched(tiny_dir, tmp_path / "self-extend", "self-extend", group_size=2, window=16)
    output = tmp_path / "out"
    capsys.readouterr()
    assert main([*_eval_args(tiny_dir, folder, output), "--attn-implementation", "flash_attention_2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"hf-posenc eval: error: --attn-implementation 'flash_attention_2' cannot run the patch saved in {folder}; "
        "use one of eager, sdpa, flex_attention."
    )
    assert not output.exists()


@pytest.mark.parametrize("saved_method", [None, "yarn"])
def test_flash_attention_that_cannot_run_is_refused_before_the_model_or_tokenizer_loads(
    tiny_dir, tmp_path, capsys, monkeypatch, saved_method
):
    """A plain folder, and one saved with a RoPE scaling (which flash attention could run): transformers would find
    out only while building the model, and may reach for a Hub kernel first; the command says it before loading."""
    folder = tiny_dir / "model"
    if saved_method is not None:
        folder = _saved_patched(tiny_dir, tmp_path / "saved", saved_method, factor=2)

    def never(*args, **kwargs):
        raise AssertionError("loaded before the check")

    monkeypatch.setattr(models, "load_base_model", never)
    monkeypatch.setattr(models.AutoTokenizer, "from_pretrained", never)
    output = tmp_path / "out"
    capsys.readouterr()
    assert main([*_eval_args(tiny_dir, folder, output), "--attn-implementation", "flash_attention_3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "hf-posenc eval: error: --attn-implementation 'flash_attention_3' cannot be used here: flash attention needs "
        "a CUDA GPU, and none is visible."
    )
    assert not output.exists()


def test_flash_attention_on_a_gpu_needs_its_package(monkeypatch):
    monkeypatch.setattr(models.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(models.transformers_utils, "is_flash_attn_2_available", lambda: False)
    monkeypatch.setattr(models.transformers_utils, "is_flash_attn_3_available", lambda: True)
    source = ModelSource("m", attn_implementation="flash_attention_2")
    with pytest.raises(ValueError, match=r"'flash_attention_2' cannot be used here: the package flash-attn is not"):
        source.check_attn_implementation(None)
    ModelSource("m", attn_implementation="flash_attention_3").check_attn_implementation(None)
    ModelSource("m", attn_implementation="sdpa").check_attn_implementation(None)
    assert models.flash_attention_problem(None) is None


def test_max_memory_is_parsed_or_refused_by_the_parser(tiny_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*eval_args(tiny_dir, tmp_path / "o"), "--device-map", "auto", "--max-memory", "0=lots"])
    assert exit_.value.code == 2 and "'0=lots' is not DEVICE=SIZE" in capsys.readouterr().err


def test_several_processes_each_splitting_the_model_are_refused():
    source = ModelSource("m", device_map="auto", max_memory={0: "70GiB", "cpu": "100GiB"})
    check_placement(source, num_processes=1)
    check_placement(ModelSource("m"), num_processes=8)
    with pytest.raises(ValueError, match=r"`device_map` splits one model .* 2 processes were launched"):
        check_placement(source, num_processes=2)


def test_revision_evaluates_that_commit_of_a_hub_model(fake_hub, tiny_dir, tmp_path):
    """Two commits of a repo (other weights in the second): ``--revision`` of the first scores what the local
    folder of the first scores, and the default (main) the second."""
    api = HfApi(token=TOKEN)
    api.create_repo("org/tiny-revs")
    first = api.upload_folder(repo_id="org/tiny-revs", folder_path=tiny_dir / "model").oid
    other = tmp_path / "other"
    shutil.copytree(tiny_dir / "model", other)
    shutil.copy(tiny_dir / "gpt2" / "model.safetensors", other / "model.safetensors")
    shutil.copy(tiny_dir / "gpt2" / "config.json", other / "config.json")
    api.upload_folder(repo_id="org/tiny-revs", folder_path=other)
    local, hub_first, hub_main = tmp_path / "local", tmp_path / "first", tmp_path / "main"
    methods = ["--method", "none", "--lengths", "32,48"]
    assert main([*eval_args(tiny_dir, local), *methods]) == 0
    dataset = ["--dataset", str(tiny_dir / "texts")]
    assert (
        main(["eval", "--model", "org/tiny-revs", "--revision", first, *dataset, "--output", str(hub_first), *methods])
        == 0
    )
    assert main(["eval", "--model", "org/tiny-revs", *dataset, "--output", str(hub_main), *methods]) == 0
    assert _ppl(hub_first) == _ppl(local)
    assert _ppl(hub_main) != _ppl(local)
    assert results_of(hub_first)["model_details"]["revision"] == first


@gpu
def test_device_map_on_a_gpu_gives_the_numbers_of_the_model_placed_whole(tiny_dir, tmp_path):
    """On CUDA, ``--device-map auto`` (and a budget that leaves part of the model on the CPU) scores what the model
    placed whole on the GPU scores: inputs go to the embeddings' device, targets to the head's."""
    plain, mapped, split = tmp_path / "plain", tmp_path / "mapped", tmp_path / "split"
    dtype = ["--dtype", "float32"]
    assert main([*eval_args(tiny_dir, plain), *METHODS, *dtype]) == 0
    assert main([*eval_args(tiny_dir, mapped), *METHODS, *dtype, "--device-map", "auto"]) == 0
    budget = ["--device-map", "sequential", "--max-memory", "0=60KB,cpu=2GiB"]  # a layer or so on the GPU
    assert main([*eval_args(tiny_dir, split), *METHODS, *dtype, *budget]) == 0
    for other in (mapped, split):
        for key, value in _ppl(plain).items():
            assert math.isclose(_ppl(other)[key], value, rel_tol=1e-4), (other, key)


def test_passkey_loads_the_model_as_eval_does(tiny_dir, tmp_path, capsys):
    """``passkey`` takes the same loading options: eager attention and ``--device-map auto`` give the default run's
    verdicts, recorded in passkey.json; a revision of a local folder is refused in one line, nothing written."""
    argv = ["passkey", "--model", str(tiny_dir / "model"), "--lengths", "400", "--depths", "0.5", "--trials", "2"]
    runs = {
        "default": [],
        "eager": ["--attn-implementation", "eager"],
        "mapped": ["--device-map", "auto", "--max-memory", "cpu=2GiB"],
    }
    records = {}
    for name, extra in runs.items():
        assert main([*argv, "--method", "none", "--output", str(tmp_path / name), *extra]) == 0
        records[name] = json.loads((tmp_path / name / "passkey.json").read_text())
    verdicts = {name: [t["correct"] for t in record["trials"]] for name, record in records.items()}
    assert verdicts["eager"] == verdicts["mapped"] == verdicts["default"]
    assert records["eager"]["model_details"]["attn_implementation"] == "eager"
    assert records["mapped"]["model_details"]["device_map"] == "auto"
    assert "attn_implementation" not in records["default"]["model_details"]
    capsys.readouterr()
    assert main([*argv, "--output", str(tmp_path / "rev"), "--revision", "v1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hf-posenc passkey: error:") and "--revision names a commit of a Hub repo" in err
    assert not (tmp_path / "rev").exists()
