"""The real offline SmolLM2-135M: our unpatched perplexity equals a plain ``labels=`` loss (short)."""

from __future__ import annotations

import math

import pytest
import torch
from accelerate import Accelerator

from hf_posenc.eval.data import build_windows
from hf_posenc.eval.perplexity import perplexity
from hf_posenc.eval.runner import score_windows


@pytest.mark.slow
def test_unpatched_ppl_equals_labels_loss_on_two_512_token_windows(smollm2, essay_ids):
    model, _ = smollm2
    doc = essay_ids[0, :1100].tolist()
    plan = build_windows([len(doc)], 512, "disjoint", bos=False)
    assert len(plan.windows) == 2 and plan.dropped_tokens == 1100 - 1024
    scored = score_windows(model, [doc], plan.windows, accelerator=Accelerator(cpu=True), chunk_size=200)
    _, ours = perplexity(sum(r[1] for r in scored), sum(r[2] for r in scored))
    with torch.no_grad():
        losses = [
            model(input_ids=essay_ids[:, k * 512 : (k + 1) * 512], labels=essay_ids[:, k * 512 : (k + 1) * 512]).loss
            for k in range(2)
        ]
    assert math.isclose(ours, math.exp(sum(loss.item() for loss in losses) / 2), rel_tol=1e-4)
    assert 15 < ours < 40  # the offline notes measure PPL 23.9 on the first 512 tokens
