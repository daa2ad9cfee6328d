"""``hf-posenc plot frequencies|bias``: files written, the model's numbers read, bad input refused in one line."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import CONFIGS, make_tiny

import hf_posenc
from hf_posenc.cli import main
from hf_posenc.cli import plot as plot_cli
from hf_posenc.plots import encoding_figures


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as file:
        return list(csv.DictReader(file))


def test_the_defaults_work_without_arguments_in_a_fresh_interpreter(tmp_path):
    environment = {**os.environ, "PYTHONPATH": str(Path(hf_posenc.__file__).parents[1]), "OMP_NUM_THREADS": "1"}
    code = "import sys; from hf_posenc.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", code, "plot", "frequencies"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "hf-posenc-results" / "plot"
    assert f"Plot: {Path('hf-posenc-results/plot/frequencies.png')}" in done.stdout
    rows = read_csv(folder / "frequencies.csv")
    assert list(dict.fromkeys(row["method"] for row in rows)) == list(plot_cli.DEFAULT_SPECS["frequencies"])
    assert len(rows) == 5 * 32 and (folder / "frequencies.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_bias_with_flags(tmp_path, capsys):
    argv = ["plot", "bias", "--method", "alibi", "--method", "t5-bias", "--method", "sinusoidal", "--method", "rope"]
    argv += ["--num-heads", "4", "--head-dim", "16", "--max-distance", "256", "--output", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "(head_dim 16, base 10000, trained_context 4096, num_heads 4)" in out
    assert f"Plot: {tmp_path / 'bias.png'}\nData: {tmp_path / 'bias.csv'}" in out
    rows = read_csv(tmp_path / "bias.csv")
    assert len(rows) == 257 * (3 + 3 + 1 + 1)  # first, middle, last head of ALiBi and T5; sinusoidal; the bound
    assert {row["series"] for row in rows if row["method"] == "sinusoidal"} == {"d = 64"}  # 4 heads x 16


def test_a_saved_t5_bias_model_shows_its_trained_table(tmp_path, capsys):
    model = hf_posenc.patch(make_tiny("llama"), "t5-bias", num_buckets=8, max_distance=16)
    with torch.no_grad():  # "trained"
        model.model.position_bias.weight.copy_(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)))
    model.save_pretrained(tmp_path / "t5")
    argv = ["plot", "bias", "--model", str(tmp_path / "t5"), "--method", "t5-bias:num_buckets=8,max_distance=16"]
    assert main([*argv, "--max-distance", "40", "--output", str(tmp_path / "out")]) == 0
    rows = [row for row in read_csv(tmp_path / "out" / "bias.csv") if row["series"] == "head 1, trained"]
    buckets = hf_posenc.t5_buckets(torch.arange(41), num_buckets=8, max_distance=16)
    expected = model.model.position_bias.weight[buckets, 0].tolist()
    assert [float(row["value"]) for row in rows] == pytest.approx(expected, rel=1e-6)

    # a bare t5-bias takes the saved bucketing (8 buckets up to 16, not the default 32 up to 128)
    assert main([*argv[:-1], "t5-bias", "--max-distance", "40", "--output", str(tmp_path / "bare")]) == 0
    bare = read_csv(tmp_path / "bare" / "bias.csv")
    assert [float(row["value"]) for row in bare if row["series"] == "head 1, trained"] == pytest.approx(
        expected, rel=1e-6
    )
    # the same bucket count with another max_distance is not the trained table's bucketing: its init is drawn
    other = [
        *argv[:-1],
        "t5-bias:num_buckets=8,max_distance=32",
        "--max-distance",
        "40",
        "--output",
        str(tmp_path / "o"),
    ]
    assert main(other) == 0
    assert {row["series"] for row in read_csv(tmp_path / "o" / "bias.csv")} == {
        f"head {h}, init=alibi" for h in (1, 3, 4)
    }


def test_a_models_config_gives_the_numbers_and_flags_override_them(tmp_path, capsys):
    model = tmp_path / "model"
    config = CONFIGS["llama"]()  # head_dim 16, 4 heads, max_position_embeddings 64, rope_theta 10000
    config.rope_parameters = {**config.rope_parameters, "rope_theta": 5e5}
    config.save_pretrained(model)
    argv = ["plot", "frequencies", "--model", str(model), "--method", "yarn:factor=4", "--output", str(tmp_path)]
    assert main([*argv, "--trained-context", "32"]) == 0
    assert (
        f"(head_dim 16, base 500000, trained_context 32, from {model}'s config and the flags)"
        in capsys.readouterr().out
    )
    rows = read_csv(tmp_path / "frequencies.csv")
    assert len(rows) == 8 and float(rows[0]["wavelength_over_context"]) == pytest.approx(2 * 3.141592653589793 / 32)
    assert float(rows[1]["inv_freq"]) == pytest.approx(5e5 ** (-2 / 16))


def test_frequencies_of_a_model_without_rope_need_a_base(tmp_path, capsys):
    """GPT-2 has no rope_theta: its "frequencies" need a base given, not drawn at the default one with no word of it."""
    model = tmp_path / "gpt2"
    make_tiny("gpt2").config.save_pretrained(model)
    argv = ["plot", "frequencies", "--model", str(model), "--output", str(tmp_path / "out")]
    assert main(argv) == 2
    assert f"error: --model {model} has no rotary embeddings (no rope_theta)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert main([*argv, "--base", "10000"]) == 0
    assert "(head_dim 16, base 10000, trained_context 64, from" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["frequencies", "--method", "alibi"], "--method 'alibi' does not rescale RoPE's frequencies"),
        (["bias", "--method", "rope", "--method", "foo"], "Unknown method 'foo'. Available methods:"),
        (["bias", "--method", "nope"], "--method 'nope' adds nothing by distance to draw"),
        (["frequencies", "--method", "yarn:factor=0.5"], "--method 'yarn:factor=0.5': factor must be >= 1"),
        (["frequencies", "--num-heads", "4"], "--num-heads is for 'plot bias' only"),
        (["frequencies", "--head-dim", "7"], "--head-dim (the rotary dimension d) must be even, got 7"),
        (["bias", "--max-distance", "0"], "--max-distance must be a positive integer, got 0"),
        (["frequencies", "--base", "1"], "--base (RoPE's b in theta_i = b^(-2i/d)) must be > 1"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, argv, said):
    assert main(["plot", *argv, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hf-posenc plot: error: ") and said in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("taken", ["frequencies.csv", "frequencies.png"])
def test_a_name_taken_by_a_folder_writes_neither_file(tmp_path, capsys, taken):
    """The plot and its numbers go together: where one of the names is a folder, the other file stays as it was."""
    out = tmp_path / "out"
    out.mkdir()
    (out / taken).mkdir()
    other = out / ("frequencies.png" if taken.endswith(".csv") else "frequencies.csv")
    other.write_text("an earlier run's")
    assert main(["plot", "frequencies", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out / taken} is not a file it can replace" in err, err
    assert other.read_text() == "an earlier run's"


def test_ctrl_c_exits_130_with_one_line(monkeypatch, capsys, tmp_path):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(encoding_figures, "write_frequency_plot", interrupted)
    assert main(["plot", "frequencies", "--output", str(tmp_path)]) == 130
    assert capsys.readouterr().err == "hf-posenc plot: interrupted.\n"


@pytest.mark.parametrize("below", ["", "sub"])
def test_an_output_that_is_a_file_or_under_one_is_one_line_naming_the_flag(tmp_path, capsys, below):
    (tmp_path / "afile").write_text("mine")
    output = tmp_path / "afile" / below if below else tmp_path / "afile"
    assert main(["plot", "bias", "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert (
        f"error: --output {output} names the folder for the plot and its CSV, and {tmp_path / 'afile'} is a file" in err
    )
    assert (tmp_path / "afile").read_text() == "mine" and "Errno" not in err


def test_a_hub_model_not_cached_with_the_hub_out_of_reach_fails_at_once(tmp_path, monkeypatch, capsys):
    """As check and card: one line naming the model and the reason, exit 2, nothing written; not huggingface_hub's
    retries (about 23 s), then exit 1 on an OSError that names neither."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    output = tmp_path / "plot.png"
    assert main(["plot", "frequencies", "--model", "me/never-cached", "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert err == (
        "hf-posenc plot: error: --model 'me/never-cached' cannot be loaded: the Hub cannot be reached "
        "(HF_HUB_OFFLINE is set), and its config.json is not in the cache.\n"
    )
    assert not any(tmp_path.iterdir())
