"""Method specifications: parsed once from ``name:key=value,...``, checked against the registry, compared."""

from __future__ import annotations

import math

import pytest

from hf_posenc.spec import MethodSpec, format_method_spec, parse_method_spec


@pytest.mark.parametrize(
    ("text", "name", "params"),
    [
        ("yarn", "yarn", {}),
        ("yarn:factor=4", "yarn", {"factor": 4}),
        (" yarn : factor = 4 , beta_fast=32.5 ", "yarn", {"factor": 4, "beta_fast": 32.5}),
        ("yarn:factor=4,truncate=False", "yarn", {"factor": 4, "truncate": False}),
        ("yarn:factor=4,ramp=ratio", "yarn", {"factor": 4, "ramp": "ratio"}),
        ("longrope:factor=2,long_factor=[1,1.5,2]", "longrope", {"factor": 2, "long_factor": [1, 1.5, 2]}),
    ],
)
def test_parse_method_spec(text, name, params):
    assert parse_method_spec(text) == (name, params)
    assert parse_method_spec(format_method_spec(name, params)) == (name, params)


def test_nan_and_inf_parse_as_floats_for_the_method_to_refuse():
    assert parse_method_spec("yarn:factor=inf,beta_fast=-INF") == ("yarn", {"factor": math.inf, "beta_fast": -math.inf})
    assert math.isnan(parse_method_spec("yarn:factor=nan")[1]["factor"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "Empty method specification"),
        (":factor=4", "has no method name"),
        ("yarn:factor", "Cannot parse 'factor' in method specification 'yarn:factor'; expected key=value"),
        ("yarn:factor=", "Cannot parse 'factor='"),
        ("yarn:factor=2,factor=4", "Parameter 'factor' is given twice"),
    ],
)
def test_specs_that_do_not_parse(text, message):
    with pytest.raises(ValueError, match=message):
        parse_method_spec(text)


def test_a_spec_is_parsed_and_checked_once():
    spec = MethodSpec.parse("linear:factor=2.0")
    assert (spec.name, spec.params, spec.method) == ("linear", {"factor": 2.0}, "pi")
    assert spec.text == "linear:factor=2.0"  # rows keep the spelling asked for
    assert spec.defaults == {"original_max_position_embeddings": None, "factor": 2.0}
    assert not spec.unpatched and MethodSpec.parse("none").unpatched
    assert MethodSpec.parse(" yarn : factor = 4 ").text == "yarn:factor=4"


def test_two_spellings_of_one_method_have_one_identity():
    assert MethodSpec.parse("pi:factor=2").identity() == MethodSpec.parse("linear:factor=2.0").identity()
    assert MethodSpec.parse("yarn:factor=2").identity() == MethodSpec.parse("yarn:beta_fast=32,factor=2").identity()
    assert MethodSpec.parse("yarn:factor=2").identity() != MethodSpec.parse("yarn:factor=3").identity()
    assert MethodSpec.parse("yarn:factor=2").identity() != MethodSpec.parse("ntk-by-parts:factor=2").identity()


def test_the_identity_on_a_model_uses_what_the_model_resolved():
    """The trained context the model fills in makes two spellings one method; once resolved on a model, the
    ALiBi backend (same numbers) does not tell methods apart."""
    short, spelled = (
        MethodSpec.parse("yarn:factor=2"),
        MethodSpec.parse("yarn:factor=2,original_max_position_embeddings=64"),
    )
    assert short.identity() != spelled.identity()
    resolved = dict(spelled.defaults)
    assert short.identity(resolved) == spelled.identity(resolved)
    eager, sdpa = MethodSpec.parse("alibi:backend=eager"), MethodSpec.parse("alibi:backend=sdpa")
    assert eager.identity() != sdpa.identity()  # before a model: two backends may be compared
    assert eager.identity({"backend": "eager", "slopes": [0.5]}) == sdpa.identity({"backend": "sdpa", "slopes": [0.5]})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("none:factor=2", "`method` 'none:factor=2': 'none' is the unpatched model and takes no parameters"),
        ("rope-magic", "Unknown method 'rope-magic'. Available methods: alibi, dca, dynamic-ntk"),
        ("yarn:fctor=4", "`method` 'yarn:fctor=4': Unknown parameter\\(s\\) 'fctor' for method 'yarn'"),
        ("yarn:factor=0.5", "`method` 'yarn:factor=0.5': factor must be >= 1"),
        ("pi", "`method` 'pi': Method 'pi': .*factor"),
        ("yarn:factor=nan", "^`method` 'yarn:factor=nan': factor must be finite, got nan.$"),
        ("yarn:factor=inf", "^`method` 'yarn:factor=inf': factor must be finite, got inf.$"),
        ("yarn:factor=-Infinity", "^`method` 'yarn:factor=-Infinity': factor must be finite, got -inf.$"),
        ("yarn:factor=-1", r"^`method` 'yarn:factor=-1': factor must be >= 1 .*got -1.0.$"),
        ("yarn:factor=0", r"^`method` 'yarn:factor=0': factor must be >= 1 .*got 0.0.$"),
        ("ntk:factor=1e308", r"^`method` 'ntk:factor=1e308': factor must be at most 2\^24 = 16777216 .*got 1e\+308.$"),
        ("yarn:factor=4,beta_fast=nan", "beta_fast must be finite, got nan"),
        ("alibi:slopes=[1e308]", r"ALiBi slopes must be finite and > 0 in float32 .*got \[1e\+308\]"),
        ("alibi:slopes=[0.5,NaN]", r"slopes\[1\] must be finite, got nan"),
    ],
)
def test_bad_specs_are_refused_naming_the_argument(text, message):
    with pytest.raises(ValueError, match=message):
        MethodSpec.parse(text)


def test_the_argument_named_in_errors_is_the_callers():
    with pytest.raises(ValueError, match="^`methods` 'yarn:factor=0.5'"):
        MethodSpec.parse("yarn:factor=0.5", parameter="methods")


@pytest.mark.parametrize(
    "text", ["dynamic-ntk+self-extend:group_size=4", "dynamic-yarn+dca", "self-extend+dynamic-ntk"]
)
def test_a_combination_that_cannot_work_is_refused_when_parsed(text):
    """Before any model: a RoPE scaling that changes with the length cannot carry a remap's re-rotated keys."""
    with pytest.raises(ValueError, match=r"changes the frequencies with the length"):
        MethodSpec.parse(text)


@pytest.mark.parametrize("text", ["yarn:factor=4", "linear:factor=2", "yarn+dca:factor=2", "self-extend+logn", "none"])
def test_a_spec_pickles_and_copies_as_what_it_says(text):
    """A combination's parameters are an instance of a class made at run time: the spec pickles as its text."""
    import copy
    import pickle

    spec = MethodSpec.parse(text)
    for copied in (pickle.loads(pickle.dumps(spec)), copy.deepcopy(spec)):
        assert copied == spec and copied.text == spec.text and copied.defaults == spec.defaults
