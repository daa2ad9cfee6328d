"""The T5 relative bias (Raffel et al. 2020, §2.1) through transformers' attention and mask interfaces: every
backend against a float64 reference, padding and the KV cache, gradients reaching the table, the trained table
saved and loaded, plain transformers refusing, bad input."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers import assert_left_padded_batch_generates_as_each_alone, assert_refused, generate, gpu, plain_load
from tiny_models import make_tiny
from torch import nn
from transformers.models.t5.modeling_t5 import T5Attention

import hf_posenc
from hf_posenc.attention.masks import alibi_distance_mask, alibi_flex_mask
from hf_posenc.attention.t5 import t5_eager_attention, t5_flex_attention, t5_sdpa_attention
from hf_posenc.methods.t5_bias import t5_bias_init

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
]
BACKENDS = ["eager", "sdpa", "flex"]  # flex runs uncompiled on CPU: a small-size check of the score_mod
BUCKETING = {"num_buckets": 8, "max_distance": 24}


def _reference(query, key, value, mask_2d, table, scale, num_buckets, max_distance):
    """float64, loops over batch rows: positions count the non-padding tokens; query i attends to non-padding
    keys j <= i with logit q.k * scale + table[bucket(i - j), h] (buckets from transformers' T5)."""
    batch, heads, n, _ = query.shape
    groups = heads // key.shape[1]
    key, value = key.repeat_interleave(groups, 1).double(), value.repeat_interleave(groups, 1).double()
    out = torch.zeros(batch, n, heads, query.shape[-1], dtype=torch.float64)
    for b in range(batch):
        positions = mask_2d[b].long().cumsum(0)
        for i in range(n):
            if not mask_2d[b, i]:
                continue
            keys = [j for j in range(i + 1) if mask_2d[b, j]]
            relative = torch.tensor([positions[j] - positions[i] for j in keys])  # key - query, as T5 takes it
            bucket = T5Attention._relative_position_bucket(
                relative, bidirectional=False, num_buckets=num_buckets, max_distance=max_distance
            )
            logits = (query[b, :, i, None].double() @ key[b, :, keys].transpose(1, 2))[:, 0] * scale  # (H, k)
            logits = logits + table.double()[bucket].T
            out[b, i] = (torch.softmax(logits, -1)[:, None, :] @ value[b, :, keys])[:, 0]  # (H, D)
    return out


FUNCTIONS = {
    "eager": (t5_eager_attention, alibi_distance_mask),
    "sdpa": (t5_sdpa_attention, alibi_distance_mask),
    "flex": (t5_flex_attention, alibi_flex_mask),
}


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_equals_the_float64_reference_with_padding(backend):
    """Left padding and a padded stretch inside a row: positions count real tokens only."""
    generator = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, n, dim = 2, 4, 2, 40, 16
    query = torch.randn(batch, heads, n, dim, generator=generator)
    key, value = (torch.randn(batch, kv_heads, n, dim, generator=generator) for _ in range(2))
    mask_2d = torch.ones(batch, n, dtype=torch.long)
    mask_2d[0, :7] = 0  # left padding
    mask_2d[1, 10:13] = 0  # a hole
    table = torch.randn(8, heads, generator=generator)
    module = SimpleNamespace(t5_position_bias=nn.Embedding.from_pretrained(table), t5_bucketing=(8, 24), training=False)
    attention, mask_function = FUNCTIONS[backend]
    mask = mask_function(batch_size=batch, q_length=n, kv_length=n, attention_mask=mask_2d.bool())
    output = attention(module, query, key, value, mask, scaling=dim**-0.5)[0]  # (B, n, H, D)
    expected = _reference(query, key, value, mask_2d.bool(), table, dim**-0.5, 8, 24)
    real = mask_2d.bool()
    torch.testing.assert_close(output[real].double(), expected[real], rtol=1e-5, atol=1e-5)


def _tiny(family="llama", backend="eager", **params):
    model = make_tiny(family)
    hf_posenc.patch(model, "t5-bias", backend=backend, **{**BUCKETING, **params})
    with torch.no_grad():  # a "trained" table: not the init, differs per head
        model.base_model.position_bias.weight.add_(torch.randn(8, 4, generator=torch.Generator().manual_seed(1)))
    return model


@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt2"])
def test_backends_agree_on_the_model_and_the_bias_is_shared_by_every_layer(family):
    ids = torch.randint(0, 97, (2, 90), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :11] = 0
    logits = {}
    for backend in BACKENDS:
        model = _tiny(family, backend)
        table = model.base_model.position_bias
        assert all(module.t5_position_bias is table for module in model.modules() if hasattr(module, "t5_bucketing"))
        with torch.no_grad():
            logits[backend] = model(ids, attention_mask=mask).logits[mask.bool()]
    torch.testing.assert_close(logits["sdpa"], logits["eager"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits["flex"], logits["eager"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cached_generation_equals_the_full_forward_and_padding_changes_nothing(backend):
    model = _tiny("llama", backend)
    prompt = torch.randint(0, 97, (1, 30), generator=torch.Generator().manual_seed(5))
    sequences, logits = generate(model, prompt, new=12)
    with torch.no_grad():
        full = model(sequences[:, :-1]).logits[:, -12:]
    torch.testing.assert_close(logits, full, rtol=1e-4, atol=1e-4)
    assert_left_padded_batch_generates_as_each_alone(model, prompt, prompt[:, 9:])


def _table_gradients(backends: list[str], device: str = "cpu") -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 97, (2, 48), generator=torch.Generator().manual_seed(6)).to(device)
    grads = {}
    for backend in backends:
        model = _tiny("llama", backend).to(device).train()
        model(ids, labels=ids).loss.backward()
        grads[backend] = model.base_model.position_bias.weight.grad.cpu()
        assert bool(grads[backend].abs().sum() > 0)
    return grads


def test_gradients_reach_the_table_equally_on_eager_and_sdpa():
    """(torch's flex attention has no backward on CPU: its gradients are checked on CUDA.)"""
    grads = _table_gradients(["eager", "sdpa"])
    torch.testing.assert_close(grads["sdpa"], grads["eager"], rtol=1e-4, atol=1e-6)


@gpu
def test_gradients_reach_the_table_through_compiled_flex():
    grads = _table_gradients(["eager", "flex"], "cuda")
    torch.testing.assert_close(grads["flex"], grads["eager"], rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("init", ["alibi", "zeros"])
def test_the_table_starts_from_the_chosen_init_and_unpatch_removes_it(init):
    model = make_tiny("llama")
    names = set(model.state_dict())
    ids = torch.randint(0, 97, (1, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before = model(ids).logits
    hf_posenc.patch(model, "t5-bias", init=init, **BUCKETING)
    expected = t5_bias_init(4, init=init, **BUCKETING).float()
    assert torch.equal(model.model.position_bias.weight, expected)
    assert set(model.state_dict()) - names == {"model.position_bias.weight"}
    assert model.model.position_bias.weight.requires_grad
    hf_posenc.unpatch(model)
    assert set(model.state_dict()) == names and not hasattr(model.model, "position_bias")
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_trained_table_is_saved_and_loaded_and_plain_transformers_refuses(tmp_path, family):
    model = _tiny(family, "sdpa")
    ids = torch.randint(0, 97, (1, 40), generator=torch.Generator().manual_seed(4))
    model.save_pretrained(tmp_path / "t5")
    loaded = hf_posenc.from_pretrained(str(tmp_path / "t5")).eval()
    assert torch.equal(loaded.base_model.position_bias.weight, model.base_model.position_bias.weight)
    assert hf_posenc.get_patch(loaded) == hf_posenc.get_patch(model)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    torch.save(ids, tmp_path / "ids.pt")
    plain = plain_load(str(tmp_path / "ids.pt"), str(tmp_path / "t5"))[str(tmp_path / "t5")]
    assert plain.startswith("KeyError") and "hf_posenc_t5_bias" in plain


@pytest.mark.parametrize(
    ("family", "params", "error", "match"),
    [
        ("llama", {"num_buckets": 32, "max_distance": 16}, ValueError, "max_distance must be at least num_buckets"),
        ("llama", {"max_distance": 10**12}, ValueError, r"max_distance must be at most 4194304 \(2\*\*22"),
        ("gpt2", {"backend": "cudnn"}, ValueError, "Unknown t5-bias backend 'cudnn'. Available backends: auto"),
        ("gpt2", {"init": "random"}, ValueError, "Unknown t5-bias init 'random'. Available inits: alibi, zeros"),
        ("gpt2", {"slopes": [1.0]}, TypeError, "Unknown parameter.*'slopes'.*Valid parameters: num_buckets"),
        ("llama", {"num_buckets": 1}, ValueError, "num_buckets must be at least 2"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(family, params, error, match):
    assert_refused(make_tiny(family), "t5-bias", params, error, match)


def test_leaving_the_t5_implementations_is_an_error():
    model = _tiny("llama", "eager")
    model.set_attn_implementation("sdpa")
    with pytest.raises(RuntimeError, match="patched with 't5-bias', but its attention implementation is now 'sdpa'"):
        model(torch.tensor([[1, 2, 3]]))


@gpu
def test_compiled_flex_on_cuda_equals_eager_with_padding():
    """On CUDA flex runs compiled, the bucket computed and looked up inside the score_mod."""
    ids = torch.randint(0, 97, (2, 300), generator=torch.Generator().manual_seed(2)).cuda()
    mask = torch.ones_like(ids)
    mask[1, :37] = 0
    logits = {}
    for backend in ("eager", "flex"):
        model = _tiny("llama", backend).cuda()
        with torch.no_grad():
            logits[backend] = model(ids, attention_mask=mask).logits[mask.bool()]
    torch.testing.assert_close(logits["flex"], logits["eager"], rtol=1e-4, atol=1e-4)


def test_patching_draws_nothing_from_torchs_global_generator():
    """The table is made with its values: a seeded run draws the same numbers after the patch as without it (no
    nn.Embedding random initialisation, overwritten at once, moves the generator on)."""
    torch.manual_seed(3)
    expected = torch.rand(4)
    model = make_tiny("llama")
    torch.manual_seed(3)
    hf_posenc.patch(model, "t5-bias")
    assert torch.equal(torch.rand(4), expected)
    assert model.model.position_bias.weight.requires_grad


def test_a_model_offloaded_whole_gets_its_table_where_it_computes(tmp_path):
    """With every weight offloaded to disk (accelerate leaves the parameters on the meta device), the table is made
    on the hooks' execution device, not on meta (where the first forward fails: "Cannot copy out of meta tensor"), and
    the model computes what the same model placed whole does; a model built on meta keeps its table there."""
    from transformers import AutoModelForCausalLM

    make_tiny("llama").save_pretrained(tmp_path / "model")
    ids = torch.randint(1, 97, (1, 40), generator=torch.Generator().manual_seed(0))
    whole = hf_posenc.patch(AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32), "t5-bias")
    offloaded = AutoModelForCausalLM.from_pretrained(
        tmp_path / "model",
        dtype=torch.float32,
        device_map="auto",
        max_memory={"cpu": "60KB"},
        offload_folder=tmp_path / "offload",
    )
    assert all(parameter.is_meta for parameter in offloaded.parameters())
    hf_posenc.patch(offloaded, "t5-bias")
    assert offloaded.model.position_bias.weight.device == torch.device("cpu")
    with torch.no_grad():
        torch.testing.assert_close(offloaded(ids).logits, whole(ids).logits, rtol=0, atol=0)
        hf_posenc.unpatch(offloaded)
        hf_posenc.unpatch(whole)
        torch.testing.assert_close(offloaded(ids).logits, whole(ids).logits, rtol=0, atol=0)
    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(make_tiny("llama").config)
    assert hf_posenc.patch(built, "t5-bias").model.position_bias.weight.is_meta
