"""A patched model as other code handles it: deep copies (reference models, EMA), pickling, in-place writes
to its buffers, hooks added after the patch, a model cast before patching. Each copy must compute what the
original computes and leave the original alone; ``unpatch`` must still restore the original bit for bit."""

from __future__ import annotations

import copy
import gc
import io
import weakref

import pytest
import torch
from helpers import assert_same, method_params, snapshot
from tiny_models import make_tiny

import hf_posenc

L = 64  # the tiny models' trained context
# Every kind of module change: static and per-call (dynamic) frequencies, ALiBi on RoPE and on GPT-2, GPT-2 PI.
CASES = [
    ("llama", "yarn"),
    ("llama", "dynamic-ntk"),
    ("llama", "dynamic-yarn"),
    ("llama", "longrope"),
    ("llama", "alibi"),
    ("gpt2", "alibi"),
    ("gpt2", "pi"),
]


def patched(family: str, method: str):
    model = make_tiny(family)
    hf_posenc.patch(model, method, **method_params(method, 8))
    return model


def logits(model, length: int) -> torch.Tensor:
    ids = torch.randint(1, 97, (1, length), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize(("family", "method"), CASES)
def test_deep_copy_runs_on_its_own_and_leaves_the_original_alone(family, method):
    model = patched(family, method)
    expected_long, expected_short = logits(model, 3 * L), logits(model, L // 2)
    twin = copy.deepcopy(model)
    hf_posenc.unpatch(model)
    unpatched = snapshot(model)
    for length, expected in ((3 * L, expected_long), (L // 2, expected_short)):
        torch.testing.assert_close(logits(twin, length), expected, rtol=0, atol=0)
        assert_same(unpatched, snapshot(model))  # the copy's forward did not reach the original
    torch.testing.assert_close(logits(model, L // 2), logits(make_tiny(family), L // 2), rtol=0, atol=0)
    twin.to(torch.bfloat16)  # the copy's own modules follow its own casts
    assert logits(twin, 3 * L).dtype == torch.bfloat16


@pytest.mark.parametrize(("family", "method"), CASES)
def test_pickled_model_computes_the_same(family, method):
    model = patched(family, method)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)  # a pickle the test wrote itself
    for length in (L // 2, 3 * L):
        torch.testing.assert_close(logits(loaded, length), logits(model, length), rtol=0, atol=0)


@pytest.mark.parametrize("method", ["dynamic-ntk", "dynamic-yarn", "longrope"])
def test_in_place_writes_to_the_frequencies_do_not_stick(method):
    """transformers' weight init writes rotary buffers in place; a per-call method sets them again on the next
    call, and neither its own cache nor what unpatch restores is touched."""
    model = make_tiny("llama")
    before = snapshot(model)
    hf_posenc.patch(model, method, **method_params(method, 8))
    rotary = model.model.rotary_emb
    for length in (L // 2, 3 * L):
        expected = logits(model, length)
        rotary.inv_freq.mul_(2)
        model._init_weights(rotary)
        torch.testing.assert_close(logits(model, length), expected, rtol=0, atol=0)
    rotary.inv_freq.mul_(2)
    hf_posenc.unpatch(model)
    assert_same(before, snapshot(model))


@pytest.mark.parametrize(("family", "method"), CASES)
def test_hooks_added_after_the_patch_survive_unpatch(family, method):
    def called_modules(model) -> list[str]:
        names = {module: name for name, module in model.named_modules()}
        calls = []
        for module in model.modules():
            module.register_forward_hook(lambda module, args, output: calls.append(names[module]))
        if hf_posenc.get_patch(model):
            hf_posenc.unpatch(model)
        logits(model, 8)
        return calls

    assert called_modules(patched(family, method)) == called_modules(make_tiny(family))


@pytest.mark.parametrize(("family", "method"), CASES)
def test_unpatch_of_a_model_cast_before_the_patch_restores_its_dtypes(family, method):
    model = make_tiny(family).to(torch.bfloat16)
    before = snapshot(model)
    hf_posenc.patch(model, method, **method_params(method, 8))
    hf_posenc.unpatch(model)
    assert_same(before, snapshot(model))


# Every kind of module change again, with the attention-level methods and the encodings that replace attention.
AFTER_CASES = [
    *CASES,
    ("llama", "logn"),
    ("llama", "self-extend"),
    ("llama", "dca"),
    ("llama", "t5-bias"),
    ("gpt2", "t5-bias"),
    ("gpt2", "nope"),
]


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
@pytest.mark.parametrize(("family", "method"), AFTER_CASES)
def test_a_copy_carries_the_patch_and_unpatches_on_its_own(family, method, how):
    """A deep copy (a reference model, EMA) or a pickle of a patched model is patched too: ``get_patch`` reports the
    same method, and ``unpatch`` gives the copy the original model back bit for bit, leaving the model it was copied
    from patched."""
    model = patched(family, method)
    expected = logits(model, 3 * L)
    if how == "deepcopy":
        twin = copy.deepcopy(model)
    else:
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        twin = torch.load(buffer, weights_only=False)  # a pickle the test wrote itself
    assert hf_posenc.get_patch(twin) == hf_posenc.get_patch(model)
    hf_posenc.unpatch(twin)
    assert hf_posenc.get_patch(twin) is None
    assert_same(snapshot(make_tiny(family)), snapshot(twin))
    assert hf_posenc.get_patch(model).method == method
    torch.testing.assert_close(logits(model, 3 * L), expected, rtol=0, atol=0)


@pytest.mark.parametrize(("family", "method"), [("llama", "yarn"), ("llama", "t5-bias"), ("gpt2", "alibi")])
def test_a_shallow_copy_is_not_the_patched_model(family, method):
    """``copy.copy`` (and accelerate's regional compilation, which copies ``__dict__``) shares the original's modules
    and record: it is not reported patched and cannot unpatch the modules it shares, so the original stays patched
    and unpatches to the model never patched."""
    model = patched(family, method)
    shallow = copy.copy(model)
    assert hf_posenc.get_patch(shallow) is None
    with pytest.raises(RuntimeError, match="or a shallow copy of a patched model"):
        hf_posenc.unpatch(shallow)
    assert hf_posenc.get_patch(model).method == method
    hf_posenc.unpatch(model)
    assert_same(snapshot(make_tiny(family)), snapshot(model))


@pytest.mark.parametrize(("family", "method"), AFTER_CASES)
def test_a_patched_model_is_freed_with_its_last_reference(family, method):
    """The patch's record on the model refers back to the model and its modules weakly: a patched model dropped is
    freed at once, as an unpatched one is (its GPU memory with it), not at the next full garbage collection."""
    model = patched(family, method)
    copies = [copy.deepcopy(model), copy.deepcopy(model)]  # a deep copy's record refers to the copy
    references = [weakref.ref(m) for m in (model, *copies)]
    gc.disable()
    try:
        del model, copies
        assert [reference() for reference in references] == [None] * 3
    finally:
        gc.enable()


@pytest.mark.parametrize(("family", "method"), [("llama", "alibi"), ("llama", "t5-bias"), ("gpt2", "alibi")])
def test_a_module_replaced_after_the_patch_is_not_kept_by_it(family, method):
    """The record keeps what ``unpatch`` puts back, not every submodule of a module the patch changed: an output
    layer replaced since (a vocabulary resized) is freed, and not carried by a deepcopy or a saved pickle: ALiBi
    and T5 bias change the model's own module, and its old head kept would be 2 GB for an 8B Llama's."""
    model = patched(family, method)
    old_head = weakref.ref(model.get_output_embeddings())
    model.resize_token_embeddings(120, mean_resizing=False)
    if family == "gpt2":  # GPT-2 ties its head to the input embeddings, which resizing keeps: untie to replace it
        model.lm_head = torch.nn.Linear(model.config.n_embd, 120, bias=False)
    gc.collect()
    assert old_head() is None
    hf_posenc.unpatch(model)
    assert model.get_output_embeddings().weight.shape[0] == 120


@pytest.mark.filterwarnings("ignore:.*(gradient|activation)_checkpointing:FutureWarning")  # renamed in 5.x
@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize(("family", "method"), AFTER_CASES)
def test_what_changed_after_the_patch_survives_unpatch(family, method, mode):
    """unpatch puts back what the patch changed and nothing else: the train/eval mode set since (a model patched
    in training and evaluated after it would otherwise run attention dropout), a submodule swapped in (an
    adapter), gradient checkpointing turned on, a vocabulary resized."""
    dropout = 0.0 if method in ("self-extend", "dca") else 0.5  # the remaps refuse training with dropout
    overrides = {"attn_pdrop": dropout} if family == "gpt2" else {"attention_dropout": dropout}
    model = make_tiny(family, **overrides).train(mode == "eval")  # patched in the other mode
    hf_posenc.patch(model, method, **method_params(method, 8))
    attention = next(m for name, m in model.named_modules() if name.endswith(("self_attn", "attn")))
    projection = "q_proj" if family == "llama" else "c_proj"
    swapped = copy.deepcopy(getattr(attention, projection))
    setattr(attention, projection, swapped)
    model.gradient_checkpointing_enable()
    model.resize_token_embeddings(120, mean_resizing=False)
    model.train(mode == "train")
    hf_posenc.unpatch(model)
    assert all(module.training == (mode == "train") for module in model.modules())
    assert getattr(attention, projection) is swapped and model.is_gradient_checkpointing
    assert model.get_output_embeddings().weight.shape[0] == model.config.vocab_size == 120
    if mode == "eval":  # and it computes what the same steps give the model never patched
        reference = make_tiny(family, **overrides).eval()
        setattr(next(m for n, m in reference.named_modules() if n.endswith(("self_attn", "attn"))), projection, swapped)
        reference.resize_token_embeddings(120, mean_resizing=False)
        with torch.no_grad():
            model.get_output_embeddings().weight[97:] = reference.get_output_embeddings().weight[97:]
            model.get_input_embeddings().weight[97:] = reference.get_input_embeddings().weight[97:]
        torch.testing.assert_close(logits(model, L // 2), logits(reference, L // 2), rtol=0, atol=0)


@pytest.mark.parametrize(("family", "method"), [("llama", "yarn"), ("llama", "self-extend"), ("gpt2", "alibi")])
def test_a_change_failing_midway_leaves_the_model_as_it_was(family, method):
    """The module changes run one after another; one that raises after others (and after changing its own module)
    leaves every module and the config as before the patch, and the model unpatched."""
    import dataclasses

    from hf_posenc.patching import apply

    model = make_tiny(family)
    before = snapshot(model)
    registered = hf_posenc.registry.get_method(method)
    plan = apply.plan_patch(model, registered, registered.make_params(**method_params(method, 8)))
    module, change = plan.changes[-1]

    def failing(target):
        change(target)
        raise RuntimeError("a change failed")

    broken = dataclasses.replace(plan, changes=[*plan.changes[:-1], (module, failing)])
    with pytest.raises(RuntimeError, match="a change failed"):
        apply._apply(model, broken)
    assert hf_posenc.get_patch(model) is None
    assert_same(before, snapshot(model))
    torch.testing.assert_close(logits(model, L // 2), logits(make_tiny(family), L // 2), rtol=0, atol=0)
