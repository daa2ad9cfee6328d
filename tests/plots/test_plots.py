"""Plots: every method visible, inf / NaN named, readable axes."""

from __future__ import annotations

import math

import pytest

from hf_posenc.plots.figures import (
    legend_labels,
    line_style,
    passkey_figure,
    plot_passkey_heatmap,
    plot_ppl_vs_length,
    ppl_figure,
    wrapped,
)

ROWS = [
    {"method": "none", "length": 2048, "ppl": 25.054},
    {"method": "none", "length": 16384, "ppl": 42.43},
    {"method": "yarn:factor=4", "length": 16384, "ppl": 23.15},
]


def test_identical_curves_stay_visible():
    rows = [{**row, "method": method} for method in ("none", "dynamic-ntk:factor=4", "yarn:factor=4") for row in ROWS]
    lines = ppl_figure(rows, trained_context=8192, title="t").axes[0].get_lines()[:3]
    assert [line.get_label() for line in lines] == ["none", "dynamic-ntk:factor=4", "yarn:factor=4"]
    assert len({line.get_marker() for line in lines}) == len({line.get_linestyle() for line in lines}) == 3
    sizes = [(line.get_markersize(), line.get_linewidth()) for line in lines]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 3  # later curves drawn inside earlier ones
    assert all(line.get_markerfacecolor() == "none" for line in lines)


def test_the_perplexity_axis_says_it_is_logarithmic():
    """Its ticks read like a linear axis (plain numbers): the label says the scale."""
    ax = ppl_figure(ROWS, trained_context=8192, title="t").axes[0]
    assert ax.get_yscale() == "log" and ax.get_ylabel() == "perplexity (log scale)"


def test_perplexities_past_float_range_or_nan_are_named_at_the_top_not_dropped():
    rows = [
        {"method": method, "length": n, "ppl": ppl}
        for method, values in {"none": [20.0, math.inf], "pi": [30.0, math.nan]}.items()
        for n, ppl in zip([1024, 2048], values, strict=True)
    ]
    ax = ppl_figure(rows, trained_context=1024, title="t").axes[0]
    lines = ax.get_lines()[:2]
    assert [list(line.get_xdata()) for line in lines] == [[1024], [1024]]
    assert [(text.get_text(), text.xy[0], text.get_color()) for text in ax.texts] == [
        ("inf", 2048, lines[0].get_color()),
        ("NaN", 2048, lines[1].get_color()),
    ]


def test_a_plot_of_no_finite_perplexity_is_drawn_and_names_them_all(tmp_path):
    """An eval run redraws the plot after each result: one that cannot be drawn would stop the run."""
    rows = [{"method": "none", "length": 1024, "ppl": math.inf}, {"method": "pi", "length": 1024, "ppl": math.nan}]
    plot_ppl_vs_length(tmp_path / "p.png", rows, trained_context=1024, title="t")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    texts = ppl_figure(rows, trained_context=1024, title="t").axes[0].texts
    assert [text.get_text() for text in texts] == ["inf", "NaN"]


def _y_labels(rows) -> list[float]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = ppl_figure(rows, trained_context=None, title="t")
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    low, high = ax.get_ylim()
    labels = [label for label in ax.yaxis.get_ticklabels(which="both") if label.get_text()]
    return sorted(y for y in (label.get_position()[1] for label in labels) if low <= y <= high)


def test_the_perplexity_axis_labels_enough_values_and_not_too_many():
    narrow = [{"method": "none", "length": n, "ppl": ppl} for n, ppl in [(2048, 25.06), (8192, 22.19), (16384, 42.43)]]
    assert len(_y_labels(narrow)) >= 4  # a log axis labels only 30 and 40 there
    wide = [{"method": "none", "length": n, "ppl": ppl} for n, ppl in [(2048, 25.0), (8192, 22.0), (16384, 2200.0)]]
    assert _y_labels(wide) == [20, 50, 100, 200, 500, 1000, 2000]  # not all nine of each decade


def test_line_styles_differ_for_many_methods():
    styles = [(style["marker"], style["linestyle"]) for style in map(line_style, range(32))]
    assert len(set(styles)) == 32


def test_long_method_specs_get_short_distinct_legend_labels():
    """Two LongRoPE specs with their factor lists run to hundreds of characters: the legend would cover the plot."""
    longrope = "longrope:factor=4.0,long_factor=[{}],short_factor=[{}],original_max_position_embeddings=4096"
    specs = [longrope.format(", ".join([f"{1 + i / 7}"] * 32), "1.0, " * 31 + "1.0") for i in range(2)]
    rows = [{**row, "method": method} for method in ("none", *specs) for row in ROWS]
    ax = ppl_figure(rows, trained_context=8192, title="t").axes[0]
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert labels[0] == "none" and labels[-1] == "trained context (8192)"
    assert labels[1:3] == ["longrope:factor=4.0,long_factor=[32 val… #1", "longrope:factor=4.0,long_factor=[32 val… #2"]
    assert [line.get_label() for line in ax.get_lines()[:3]] == labels[:3]


@pytest.mark.parametrize("trained_context", [256, 65536])
def test_a_trained_context_outside_the_lengths_is_drawn_inside_the_axes(trained_context):
    """Left at the measured lengths, the axis would cut its line off: in the legend, nowhere on the plot."""
    ax = ppl_figure(ROWS, trained_context=trained_context, title="t").axes[0]
    (line,) = [line for line in ax.get_lines() if line.get_label().startswith("trained context")]
    low, high = ax.get_xlim()
    assert list(line.get_xdata()) == [trained_context, trained_context] and low < trained_context < high
    assert low < 2048 < 16384 < high  # the lengths measured stay inside too


def test_passkey_panels_are_titled_by_short_distinct_labels(tmp_path):
    """A panel is 1.1 inches a length: a LongRoPE spec as its title would run across the panels beside it. Titles are
    the legend labels on lines of about the panel's width (14 characters at one length), three at most."""
    longrope = "longrope:factor=4.0,long_factor=[{}],original_max_position_embeddings=4096"
    methods = ["none", *(longrope.format(", ".join([f"{1 + i / 7}"] * 32)) for i in range(2))]
    methods += ["self-extend:group_size=4,window=1024", "self-extend:group_size=8,window=1024"]
    grid = [
        {"method": method, "length": 2048, "depth": depth, "accuracy": 0.5} for method in methods for depth in (0, 1)
    ]
    titles = [ax.get_title() for ax in passkey_figure(grid, title="passkey").axes[: len(methods)]]
    assert titles == [
        "none",
        "longrope:\nfactor=4.0,\nlong_facto… #1",  # the lists differ in their values only
        "longrope:\nfactor=4.0,\nlong_facto… #2",
        "self-extend:\ngroup_size=4",
        "self-extend:\ngroup_size=8",
    ]
    plot_passkey_heatmap(tmp_path / "passkey.png", grid, title="passkey")
    assert (tmp_path / "passkey.png").read_bytes().startswith(b"\x89PNG")


def test_labels_past_the_width_keep_the_parameters_that_tell_specs_apart():
    """Cut from the right, two yarn specs differing in beta_fast alone read alike but for #1 / #2; the parameters all
    specs of a method share are left out first. Labels that fit are left whole."""
    specs = [f"yarn:factor=4,original_max_position_embeddings=8192,beta_fast={beta}" for beta in (32, 16)]
    assert legend_labels([*specs, "none"]) == {
        specs[0]: "yarn:beta_fast=32",
        specs[1]: "yarn:beta_fast=16",
        "none": "none",
    }
    short = ["yarn:factor=4", "yarn:factor=8", "dca"]
    assert legend_labels(short) == {spec: spec for spec in short}
    assert wrapped("self-extend:group_size=4,window=1024,backend=sdpa", 28) == (
        "self-extend:group_size=4,\nwindow=1024,backend=sdpa"
    )
