"""The real offline SmolLM2-135M: our unpatched perplexity equals a plain ``labels=`` loss (short), and the
passkey verdict equals greedy generation."""

from __future__ import annotations

import math
import re

import pytest
import torch
from accelerate import Accelerator

from hf_posenc.eval.data import build_windows
from hf_posenc.eval.passkey import build_prompt, ends_the_number
from hf_posenc.eval.perplexity import greedy_continuation, perplexity
from hf_posenc.eval.scoring import score_lengths


@pytest.mark.slow
def test_unpatched_ppl_equals_labels_loss_on_two_512_token_windows(smollm2, essay_ids):
    model, _ = smollm2
    doc = essay_ids[0, :1100].tolist()
    plan = build_windows([len(doc)], 512, "disjoint", bos=False)
    assert len(plan.windows) == 2 and plan.dropped_tokens == 1100 - 1024
    scored = score_lengths(model, [doc], {512: plan.windows}, accelerator=Accelerator(cpu=True), chunk_size=200)[512]
    _, ours = perplexity(sum(r[0] for r in scored.windows), sum(r[1] for r in scored.windows))
    with torch.no_grad():
        losses = [
            model(input_ids=essay_ids[:, k * 512 : (k + 1) * 512], labels=essay_ids[:, k * 512 : (k + 1) * 512]).loss
            for k in range(2)
        ]
    assert math.isclose(ours, math.exp(sum(loss.item() for loss in losses) / 2), rel_tol=1e-4)
    assert 15 < ours < 40  # the offline notes measure PPL 23.9 on the first 512 tokens


@pytest.mark.slow
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_passkey_verdict_equals_greedy_generation(smollm2, depth):
    """The teacher-forced verdict (the key's tokens, then no further digit) against ``generate()``: the first
    number of the greedy answer is the key."""
    model, tokenizer = smollm2
    prompt = build_prompt(tokenizer, 1024, depth, key=60494)
    ids = torch.tensor([prompt.input_ids])
    with torch.no_grad():
        generated = model.generate(ids[:, : prompt.answer_from], max_new_tokens=8, do_sample=False)
    answer = re.match(r"\s?(\d+)", tokenizer.decode(generated[0, prompt.answer_from :]))
    matches, after = greedy_continuation(model, ids, prompt.answer_from)
    verdict = bool(matches[0]) and ends_the_number(tokenizer, int(after[0]))
    assert verdict == (answer is not None and answer.group(1) == "60494")
