"""The flex backend compiled (as on CUDA, forced here on CPU): no recompilation per decoding step.

Past torch._dynamo's recompile limit a compiled flex_attention falls back to an uncompiled path that
materialises n x n scores: a KV-cache generation that recompiled at each step (cache offsets captured as
Python ints) would run out of memory at long lengths instead of failing. Recompiling is decided by dynamo's
guards, before any backend: flex_attention is compiled here with the ``aot_eager`` backend (inductor's CPU
flex template does not build this score_mod with dynamic shapes in torch 2.13), the block mask with
inductor as in the library. Compiling takes tens of seconds on CPU, so the test is marked slow."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from helpers import generate
from tiny_models import make_tiny

import hf_posenc
from hf_posenc.attention import compiled_flex, functions, masks


@pytest.mark.slow
def test_compiled_flex_generates_without_recompiling(monkeypatch):
    monkeypatch.setattr(masks, "compiles_flex", lambda device: True)
    compiled = torch.compile(functions.flex_attention, dynamic=True, backend="aot_eager")
    monkeypatch.setattr(compiled_flex, "_compiled_flex_attention", lambda: compiled)
    monkeypatch.setattr(compiled_flex, "STATIC_PREFILLS", 0)  # prefills too on the compilation for dynamic shapes
    torch._dynamo.reset()
    model = make_tiny("llama")
    hf_posenc.patch(model, "alibi", backend="flex")
    eager = make_tiny("llama")
    hf_posenc.patch(eager, "alibi", backend="eager")
    prompt = torch.randint(1, 97, (1, 24), generator=torch.Generator().manual_seed(0))
    generate(model, prompt, new=3)  # compiles: the prefill, the one-token decoding steps
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 2  # the block mask and the attention
    longer = torch.randint(1, 97, (1, 37), generator=torch.Generator().manual_seed(1))
    with torch.compiler.set_stance("fail_on_recompile"):
        sequences, logits = generate(model, longer, new=30)  # new prompt length, 30 new cache offsets
    expected_sequences, expected_logits = generate(eager, longer, new=30)
    assert torch.equal(sequences, expected_sequences)
    torch.testing.assert_close(logits, expected_logits, rtol=1e-4, atol=1e-4)

    # Left padding: the score_mod that looks positions up, compiled once as well.
    generate(model, *left_padded(20, 3), new=2)
    with torch.compiler.set_stance("fail_on_recompile"):
        sequences, logits = generate(model, *left_padded(29, 11), new=12)
    expected_sequences, expected_logits = generate(eager, *left_padded(29, 11), new=12)
    assert torch.equal(sequences, expected_sequences)
    torch.testing.assert_close(logits, expected_logits, rtol=1e-4, atol=1e-4)


def left_padded(length: int, padding: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of ``length`` tokens, the second with ``padding`` of them masked on the left."""
    ids = torch.randint(1, 97, (2, length), generator=torch.Generator().manual_seed(length))
    mask = (torch.arange(length) >= torch.tensor([[0], [padding]])).long()
    return ids, mask


def test_prefills_get_fixed_shape_compilations_up_to_a_bound(monkeypatch):
    """A prefill gets flex compiled for its shapes (a faster kernel), for the first few kinds of call; decoding
    steps and kinds past the bound get the compilation for dynamic shapes."""
    monkeypatch.setattr(compiled_flex, "_STATIC", compiled_flex.StaticPrefills())
    monkeypatch.setattr(compiled_flex, "_compiled_flex_attention", lambda: lambda *args, **kwargs: "dynamic")
    monkeypatch.setattr(compiled_flex, "_compiled_static_flex_attention", lambda: lambda *args, **kwargs: "static")

    def compiled_for(q_length: int, kv_length: int, label: str = "ALiBi indices") -> str:
        query, key = torch.empty(1, 4, q_length, 16), torch.empty(1, 2, kv_length, 16)
        return compiled_flex.compiled_flex(label, query, key, key, scale=0.25)

    assert compiled_for(1, 40) == "dynamic"  # a decoding step
    kinds = [compiled_for(n, n) for n in (64, 128, 256)] + [compiled_for(64, 64, "ALiBi positions")]
    assert kinds == ["static"] * compiled_flex.STATIC_PREFILLS
    assert compiled_for(512, 512) == "dynamic"  # past the bound
    assert compiled_for(128, 128) == "static"  # a kind already compiled for
    with torch.no_grad():
        assert compiled_for(128, 128) == "dynamic"  # grad mode is part of the kind (dynamo guards on it)


@pytest.mark.slow
def test_at_dynamos_recompile_limit_prefills_go_to_the_dynamic_compilation(monkeypatch):
    """Dynamo guards on more than a kind records, and the bound may be set past its recompile limit (8): the
    fixed-shape compilation raises there (fullgraph) and that call, and every later prefill, runs the dynamic
    compilation, never uncompiled flex (n x n on a GPU). Same logits as the eager backend throughout."""
    monkeypatch.setattr(masks, "compiles_flex", lambda device: True)
    monkeypatch.setattr(compiled_flex, "STATIC_PREFILLS", 100)  # only dynamo's limit stops the fixed shapes
    dynamic = torch.compile(functions.flex_attention, dynamic=True, backend="aot_eager")
    static = torch.compile(compiled_flex._static_flex, dynamic=False, fullgraph=True, backend="eager")
    calls = {"static": 0, "dynamic": 0}

    def counted(name, compiled):
        def run(*args, **kwargs):
            calls[name] += 1
            return compiled(*args, **kwargs)

        return lambda: run

    monkeypatch.setattr(compiled_flex, "_STATIC", compiled_flex.StaticPrefills())
    monkeypatch.setattr(compiled_flex, "_compiled_flex_attention", counted("dynamic", dynamic))
    monkeypatch.setattr(compiled_flex, "_compiled_static_flex_attention", counted("static", static))
    torch._dynamo.reset()
    model, eager = make_tiny("llama"), make_tiny("llama")
    hf_posenc.patch(model, "alibi", backend="flex")
    hf_posenc.patch(eager, "alibi", backend="eager")
    ids = torch.randint(1, 97, (1, 40), generator=torch.Generator().manual_seed(2))
    with pytest.warns() as warned:
        for length in (16, 24, 32, 40):
            for mode, cache in ((torch.no_grad, False), (torch.inference_mode, False), (torch.no_grad, True)):
                with mode():
                    logits = model(ids[:, :length], use_cache=cache).logits
                    expected = eager(ids[:, :length], use_cache=cache).logits
                torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
        warnings.warn("the block needs one warning for pytest.warns", stacklevel=1)
    assert not [w for w in warned if "without torch.compile" in str(w.message)]  # never uncompiled
    assert compiled_flex._STATIC.closed  # the limit was reached, and the calls went on
    limit, layers = torch._dynamo.config.recompile_limit, model.config.num_hidden_layers
    # Forwards 1..limit on fixed shapes (one compilation each, all layers); the next one's first layer refused
    # there, and it and every later forward on the dynamic compilation.
    assert calls == {"static": layers * limit + 1, "dynamic": layers * (12 - limit)}


def test_a_failed_compilation_for_fixed_shapes_is_a_warning_and_the_call_goes_on(monkeypatch, caplog):
    """Reaching dynamo's recompile limit is expected (a note); a compilation that fails slows every later call (on
    the dynamic compilation), which a benchmark would show without a cause: a warning."""
    query = torch.randn(1, 2, 16, 8)

    def failing():
        def run(*args, **kwargs):
            raise torch._dynamo.exc.InternalTorchDynamoError("inductor failed")

        return run

    monkeypatch.setattr(compiled_flex, "_STATIC", compiled_flex.StaticPrefills())
    monkeypatch.setattr(compiled_flex, "_compiled_static_flex_attention", failing)
    monkeypatch.setattr(compiled_flex, "_compiled_flex_attention", lambda: functions.flex_attention)
    with caplog.at_level(logging.INFO, logger=compiled_flex.__name__):
        output = compiled_flex.compiled_flex("test", query, query, query)
    torch.testing.assert_close(output, functions.flex_attention(query, query, query))
    assert compiled_flex._STATIC.closed
    [record] = [r for r in caplog.records if "could not be compiled for fixed shapes" in r.getMessage()]
    assert record.levelno == logging.WARNING and "inductor failed" in record.getMessage()
