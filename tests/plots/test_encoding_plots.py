"""Encoding plots: the numbers are the papers' formulas, the CSV holds what is drawn, bad input writes nothing."""

from __future__ import annotations

import cmath
import csv
import math

import matplotlib.image
import pytest
import torch
from hub_server import BASE_REPO, upload_base
from huggingface_hub import ModelCard
from tiny_models import make_tiny
from transformers import AutoModelForCausalLM

import hf_posenc
from hf_posenc.hub import push as hub
from hf_posenc.methods.sinusoidal import sinusoidal_embedding
from hf_posenc.methods.t5_bias import bucket_distances
from hf_posenc.plots.encoding_data import bias_data, frequency_data, rope_decay_bound
from hf_posenc.plots.encoding_figures import (
    BIAS_PANELS,
    FREQUENCY_COLUMNS,
    bias_figure,
    frequency_figure,
    patch_plot_file,
    write_bias_plot,
    write_frequency_plot,
)
from hf_posenc.record import PatchRecord

D, BASE, L = 64, 10000.0, 4096
GEOMETRY = dict(head_dim=D, base=BASE, trained_context=L)


def scales(spec: str, **kwargs) -> tuple[list[float], list[float], dict]:
    """``(r_i = L / lambda_i, theta_i / theta_i', first row)`` of one method."""
    rows = frequency_data([spec], **{**GEOMETRY, **kwargs})
    return [1 / row["wavelength_over_context"] for row in rows], [row["scale"] for row in rows], rows[0]


def test_pi_divides_every_pair_by_the_factor():
    _, scale, row = scales("pi:factor=4")
    assert scale == pytest.approx([4.0] * (D // 2), rel=1e-12)
    assert (row["attention_factor"], row["seq_len"]) == (1.0, None)


def test_ntk_scales_pair_i_by_s_to_the_2i_over_d_minus_2():
    """b' = b s^(d/(d-2)) gives theta_i / theta_i' = s^(2i/(d-2)): the first pair kept, the last divided by s."""
    _, scale, _ = scales("ntk:factor=4")
    assert scale == pytest.approx([4 ** (2 * i / (D - 2)) for i in range(D // 2)], rel=1e-12)


@pytest.mark.parametrize("ramp", ["index", "ratio"])
def test_yarn_keeps_pairs_that_rotate_more_than_beta_times_and_interpolates_those_below_alpha(ramp):
    """YaRN §3.2 with r = L / lambda: gamma = 1 (kept) for r > beta = beta_fast, 0 (theta / s) for r < alpha."""
    ratio, scale, row = scales(f"yarn:factor=4,beta_fast=32,beta_slow=1,ramp={ramp}")
    kept = [s for r, s in zip(ratio, scale, strict=True) if r > 32]
    interpolated = [s for r, s in zip(ratio, scale, strict=True) if r < 1]
    assert kept and interpolated and len(kept) + len(interpolated) < len(scale)  # a blend band between
    assert kept == pytest.approx([1.0] * len(kept), rel=1e-12)
    assert interpolated == pytest.approx([4.0] * len(interpolated), rel=1e-12)
    assert row["attention_factor"] == pytest.approx(0.1 * math.log(4) + 1)  # §3.4


def test_llama3_keeps_short_wavelengths_and_interpolates_long_ones():
    ratio, scale, _ = scales("llama3:factor=8,low_freq_factor=1,high_freq_factor=4")
    for r, s in zip(ratio, scale, strict=True):
        if r > 4:  # lambda < L / high_freq_factor
            assert s == pytest.approx(1.0, rel=1e-12)
        elif r < 1:  # lambda > L / low_freq_factor
            assert s == pytest.approx(8.0, rel=1e-12)
        else:
            assert 1 <= s <= 8


def test_dynamic_methods_are_drawn_at_factor_times_l_unless_told_and_a_combination_at_its_rope_part():
    _, scale, row = scales("dynamic-ntk:factor=4")
    s = 4 * (4 * L) / L - 3  # emozilla: s l / L - (s - 1) at l = 4 L
    assert row["seq_len"] == 4 * L and scale == pytest.approx([s ** (2 * i / (D - 2)) for i in range(D // 2)])
    assert scales("dynamic-yarn")[2]["seq_len"] == 4 * L  # no factor: l = 4 L
    assert scales("dynamic-ntk:factor=4", seq_len=L)[1] == pytest.approx([1.0] * (D // 2))  # unchanged up to L
    assert scales("yarn+logn:factor=4")[1] == scales("yarn:factor=4")[1]
    assert scales("rope")[1] == scales("none")[1] == [1.0] * (D // 2)


def test_the_decay_bound_is_roformers_sum_computed_by_hand():
    """(1/(d/2)) sum_{j=1}^{d/2} |sum_{k<j} e^{i n theta_k}|, looped in plain Python (RoFormer §3.4.3)."""
    theta = [BASE ** (-2 * k / 8) for k in range(4)]  # d = 8
    inv_freq = torch.tensor(theta, dtype=torch.float64)
    distances = torch.tensor([0, 1, 2, 5, 17, 100, 4097])
    expected = [
        sum(abs(sum(cmath.exp(1j * n * theta[k]) for k in range(j))) for j in range(1, 5)) / 4
        for n in distances.tolist()
    ]
    assert rope_decay_bound(inv_freq, distances).tolist() == pytest.approx(expected, rel=1e-12)
    assert rope_decay_bound(inv_freq, torch.tensor([0])).item() == pytest.approx((4 + 1) / 2)  # |S_j| = j at n = 0


def test_bias_curves_are_each_encodings_formula():
    curves = bias_data(
        ["alibi", "t5-bias:num_buckets=8,max_distance=16", "sinusoidal", "rope", "yarn:factor=4"],
        max_distance_shown=300,
        num_heads=4,
        head_dim=8,
        base=BASE,
        trained_context=64,
    )
    by_name = {(curve.method, curve.series): curve.values for curve in curves}
    n = torch.arange(301, dtype=torch.float64)
    assert by_name["alibi", "head 1 (m = 0.25)"].tolist() == (-0.25 * n).tolist()  # 4 heads: m_h = 2^(-2h)
    assert by_name["alibi", "head 4 (m = 0.00391)"].tolist() == (-(2.0**-8) * n).tolist()
    t5 = by_name["t5-bias:num_buckets=8,max_distance=16", "head 1, init=alibi"]
    assert t5[:4].tolist() == [0.0, -0.25, -0.5, -0.75]  # the exact buckets
    assert t5[16:].unique().tolist() == [-0.25 * bucket_distances(8, 16)[-1].item()]  # all share the last bucket
    sinusoidal, d = by_name["sinusoidal", "d = 32"], 32  # the model width, heads x head_dim
    w = BASE ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    assert sinusoidal.tolist() == pytest.approx(torch.cos(n[:, None] * w).mean(-1).tolist(), abs=1e-12)
    p = 1234  # PE(p).PE(p + n) does not depend on p
    shifted = (sinusoidal_embedding(p + n, d) @ sinusoidal_embedding(torch.tensor(float(p)), d)) / (d / 2)
    assert shifted.tolist() == pytest.approx(sinusoidal.tolist(), abs=1e-9)
    theta = torch.tensor([BASE ** (-2 * k / 8) for k in range(4)], dtype=torch.float64)
    assert by_name["rope", "bound"].tolist() == rope_decay_bound(theta, n.long()).tolist()
    yarn = hf_posenc.rope_frequencies("yarn", head_dim=8, base=BASE, original_max_position_embeddings=64, factor=4)[0]
    assert by_name["yarn:factor=4", "bound"].tolist() == rope_decay_bound(yarn, n.long()).tolist()


def test_the_csvs_hold_the_plotted_numbers_and_the_pngs_are_images(tmp_path):
    specs = ["pi:factor=4", "yarn:factor=4", "longrope:factor=4,long_factor=[" + ",".join(["2.5"] * 32) + "]"]
    png, data = write_frequency_plot(tmp_path, specs, **GEOMETRY)
    with data.open() as file:
        table = list(csv.DictReader(file))
    assert list(table[0]) == list(FREQUENCY_COLUMNS) and len(table) == 3 * D // 2
    lines = frequency_figure(frequency_data(specs, **GEOMETRY), trained_context=L, title="t").axes[0].get_lines()
    for index, line in enumerate(lines[:3]):
        rows = table[index * D // 2 : (index + 1) * D // 2]
        assert [float(row["wavelength_over_context"]) for row in rows] == list(line.get_xdata())
        assert [float(row["scale"]) for row in rows] == list(line.get_ydata())
    attention = math.sqrt(1 + math.log(4) / math.log(L))  # LongRoPE / Phi-3's default
    assert (
        lines[2].get_label()
        == f"longrope:factor=4,long_factor=[32 values] (attention ×{attention:.4g}) at l = 16384 = 4 L"
    )
    assert [float(row["scale"]) for row in table[D:]] == pytest.approx([2.5] * (D // 2))  # the long factors past L
    assert matplotlib.image.imread(png).ndim == 3  # a PNG that decodes

    geometry = dict(max_distance_shown=100, num_heads=8, **GEOMETRY)
    png, data = write_bias_plot(tmp_path, ["alibi", "t5-bias", "sinusoidal", "rope"], **geometry)
    with data.open() as file:
        table = list(csv.DictReader(file))
    curves = bias_data(["alibi", "t5-bias", "sinusoidal", "rope"], **geometry)
    axes = bias_figure(curves, trained_context=L, title="t").axes
    assert [ax.get_title() for ax in axes] == list(BIAS_PANELS.values())
    drawn = [line for ax in axes for line in ax.get_lines()]
    assert len(table) == 101 * len(curves) == 101 * len(drawn) == 101 * 8  # 3 + 3 heads, sinusoidal, rope
    for index, line in enumerate(drawn):
        rows = table[index * 101 : (index + 1) * 101]
        assert [int(row["distance"]) for row in rows] == list(range(101))
        assert [float(row["value"]) for row in rows[1:]] == line.get_ydata().tolist()  # n = 0 off the log axis
    assert matplotlib.image.imread(png).ndim == 3


@pytest.mark.parametrize(
    ("call", "specs", "match"),
    [
        (frequency_data, ["alibi"], r"`specs` 'alibi' does not rescale RoPE's frequencies; .*: dynamic-ntk, .*, yarn;"),
        (bias_data, ["nope"], r"`specs` 'nope' adds nothing by distance to draw; this plot draws alibi, t5-bias"),
        (frequency_data, ["yarn:factor=4,original_max_position_embeddings=8192"], "give the trained context once"),
        (frequency_data, [], "one or more method specs"),
        (bias_data, ["self-extend"], "adds nothing by distance"),
    ],
)
def test_what_a_plot_cannot_draw_is_refused_by_name(call, specs, match):
    extra = dict(max_distance_shown=10, num_heads=2) if call is bias_data else {}
    with pytest.raises(ValueError, match=match):
        call(specs, **GEOMETRY, **extra)


def test_bad_input_writes_nothing(tmp_path):
    with pytest.raises(ValueError, match="`head_dim` .* must be even"):
        write_frequency_plot(tmp_path / "out", ["pi:factor=2"], head_dim=7, base=BASE, trained_context=L)
    with pytest.raises(ValueError, match="Unknown method 'foo'"):
        write_bias_plot(tmp_path / "out", ["rope", "foo"], max_distance_shown=10, num_heads=2, **GEOMETRY)
    # sizes that would ask for terabytes: refused before anything is allocated
    with pytest.raises(ValueError, match=r"`head_dim` must be at most 4096, got 1000000000000"):
        write_frequency_plot(tmp_path / "out", ["pi:factor=2"], head_dim=10**12, base=BASE, trained_context=L)
    with pytest.raises(ValueError, match=r"`num_heads` must be at most 1024, got 1000000000"):
        write_bias_plot(tmp_path / "out", ["alibi"], max_distance_shown=10, num_heads=10**9, **GEOMETRY)
    with pytest.raises(ValueError, match=r"`num_heads` x `head_dim` .* at most 65536, got 1024 x 1024"):
        geometry = {**GEOMETRY, "head_dim": 1024}
        write_bias_plot(tmp_path / "out", ["sinusoidal"], max_distance_shown=10, num_heads=1024, **geometry)
    assert not (tmp_path / "out").exists()


def test_a_push_carries_the_encoding_plot_and_the_card_shows_it(fake_hub):
    upload_base()
    model = hf_posenc.patch(AutoModelForCausalLM.from_pretrained(BASE_REPO), "yarn", factor=4)
    hub.push_to_hub(model, "me/tiny-yarn")  # by default
    assert fake_hub.files("me/tiny-yarn")["frequencies.png"][:8] == b"\x89PNG\r\n\x1a\n"
    assert "![What yarn does to each rotary frequency](frequencies.png)" in ModelCard.load("me/tiny-yarn").text
    hub.push_to_hub(model, "me/tiny-yarn", exist_ok=True, encoding_plot=False)  # a later push without it: none
    assert "frequencies.png" not in fake_hub.files("me/tiny-yarn")
    assert "frequencies.png" not in ModelCard.load("me/tiny-yarn").text


@pytest.mark.parametrize(
    ("method", "params", "plot"),
    [
        ("ntk", {"factor": 2}, "frequencies.png"),
        ("yarn+logn", {"factor": 2}, "frequencies.png"),
        ("alibi", {}, None),
        ("logn", {}, None),
    ],
)
def test_only_a_rope_scaling_alone_or_in_a_combination_gets_the_plot(method, params, plot):
    model = hf_posenc.patch(make_tiny("llama"), method, **params)
    assert patch_plot_file(PatchRecord.from_config(model.config)) == plot
