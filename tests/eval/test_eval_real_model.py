"""The real offline SmolLM2-135M: our unpatched perplexity equals a plain ``labels=`` loss (short), 128 tokens
read from a 256 forward equal a 128 forward, and the passkey verdict equals greedy generation."""

from __future__ import annotations

import math
import re

import pytest
import torch
from accelerate import Accelerator

import hf_posenc
from hf_posenc.eval.data import build_windows
from hf_posenc.eval.passkey import build_prompt, ends_the_number
from hf_posenc.eval.perplexity import greedy_continuation, perplexity
from hf_posenc.eval.scoring import score_lengths

# the model loads on one worker, for these tests and tests/patching/test_real_model.py's
pytestmark = pytest.mark.xdist_group("smollm2")


@pytest.mark.slow
def test_unpatched_ppl_equals_labels_loss_on_two_256_token_windows(smollm2, essay_ids):
    model, _ = smollm2
    doc = essay_ids[0, :600].tolist()
    plan = build_windows([len(doc)], 256, "disjoint", bos=False)
    assert len(plan.windows) == 2 and plan.dropped_tokens == 600 - 512
    scored = score_lengths(model, [doc], {256: plan.windows}, accelerator=Accelerator(cpu=True), chunk_size=100)[256]
    _, ours = perplexity(sum(r[0] for r in scored.windows), sum(r[1] for r in scored.windows))
    with torch.no_grad():
        losses = [
            model(input_ids=essay_ids[:, k * 256 : (k + 1) * 256], labels=essay_ids[:, k * 256 : (k + 1) * 256]).loss
            for k in range(2)
        ]
    assert math.isclose(ours, math.exp(sum(loss.item() for loss in losses) / 2), rel_tol=1e-4)
    assert 15 < ours < 40, ours  # a plausible range; the offline notes measure PPL 23.9 on the first 512 tokens


@pytest.mark.slow
@pytest.mark.parametrize(("method", "bos"), [("none", False), ("yarn", True)])
def test_128_read_from_a_256_forward_equals_a_128_forward(smollm2, essay_ids, method, bos):
    """The truncate protocol's shared forward on the real model, float32: relative 1e-5 (yarn: factor 4)."""
    model, tokenizer = smollm2
    doc, bos_id = essay_ids[0, :400].tolist(), tokenizer.bos_token_id if bos else None
    plans = {n: build_windows([len(doc)], n, "truncate", bos=bos).windows for n in (128, 256)}
    accelerator = Accelerator(cpu=True)
    with hf_posenc.patched(model, "yarn", factor=4) if method == "yarn" else torch.no_grad():
        together = score_lengths(model, [doc], plans, accelerator=accelerator, bos_id=bos_id)
        alone = score_lengths(model, [doc], {128: plans[128]}, accelerator=accelerator, bos_id=bos_id)[128]
    assert (together[128].forwards, together[128].derived_from, together[256].forwards) == (0, 256, 1)
    ((nll, tokens),) = together[128].windows
    assert tokens == alone.windows[0][1] == 127  # BOS + 127 tokens, or 128 tokens and the first unscored
    assert math.isclose(nll, alone.windows[0][0], rel_tol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_passkey_verdict_equals_greedy_generation(smollm2, depth):
    """The teacher-forced verdict (the key's tokens, then no further digit) against ``generate()``: the first
    number of the greedy answer is the key."""
    model, tokenizer = smollm2
    prompt = build_prompt(tokenizer, 256, depth, key=60494)
    ids = torch.tensor([prompt.input_ids])
    with torch.no_grad():
        generated = model.generate(ids[:, : prompt.answer_from], max_new_tokens=8, do_sample=False)
    answer = re.match(r"\s?(\d+)", tokenizer.decode(generated[0, prompt.answer_from :]))
    matches, after = greedy_continuation(model, ids, prompt.answer_from)
    verdict = bool(matches[0]) and ends_the_number(tokenizer, int(after[0]))
    assert verdict == (answer is not None and answer.group(1) == "60494")
