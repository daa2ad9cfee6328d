"""``hf-posenc methods [NAME]``: each method's parameters, defaults and paper, from the one place they are written."""

from __future__ import annotations

import dataclasses

import pytest

from hf_posenc.cli import main
from hf_posenc.fields import field_help
from hf_posenc.registry import available_methods, get_method


@pytest.mark.parametrize("name", available_methods())
def test_every_parameter_of_every_method_has_its_help_on_its_field(name):
    params = get_method(name).params
    assert set(field_help(params)) == {item.name for item in dataclasses.fields(params)}
    for item in dataclasses.fields(params):  # the docstring the docs render is built from the same help
        assert f"    {item.name} (`" in params.__doc__, item.name


def test_the_listing_names_every_method_and_its_summary(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for name in available_methods():
        method = get_method(name)
        assert any(line.startswith(f"{name} ") or line == name for line in out.splitlines()), name
        assert " ".join(method.summary.split()[:4]) in " ".join(out.split()), name


@pytest.mark.parametrize("name", ["yarn", "linear", "self-extend+logn"])
def test_one_method_shows_each_parameter_with_its_default_and_help(capsys, name):
    assert main(["methods", name]) == 0
    out = " ".join(capsys.readouterr().out.split())
    method = get_method(name)
    for part in method.components:
        assert part.paper in out
        for item in dataclasses.fields(part.params):
            default = "required" if item.default is dataclasses.MISSING else f"default {item.default!r}"
            assert f"{item.name} ({item.type}; {default})" in out, item.name
            assert " ".join(field_help(part.params)[item.name].split()) in out, item.name


def test_an_unknown_method_is_one_line_naming_the_available_ones(capsys):
    assert main(["methods", "yarnn"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hf-posenc methods: error: Unknown method 'yarnn'. Available methods: alibi,")
    assert err.count("\n") == 1
