"""model_fingerprint of a model loaded with a device_map that offloads: the same as the model placed whole."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_tiny
from transformers import AutoModelForCausalLM

from hf_posenc.hub.fingerprint import model_fingerprint


def test_an_offloaded_model_has_the_fingerprint_of_the_model_placed_whole(tmp_path):
    """Disk offload (and CPU offload beside it: both leave the parameters on meta, their values in accelerate's
    hooks) fingerprints the weights, not their names and shapes only; a model built on meta has none."""
    make_tiny("llama").save_pretrained(tmp_path / "model")
    whole = model_fingerprint(AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32))
    for budget in ("60KB", "150KB"):  # all on disk; some on the CPU, the rest on disk
        offloaded = AutoModelForCausalLM.from_pretrained(
            tmp_path / "model",
            dtype=torch.float32,
            device_map="auto",
            max_memory={"cpu": budget},
            offload_folder=tmp_path / f"offload-{budget}",
        )
        assert any(parameter.is_meta for parameter in offloaded.parameters())
        assert model_fingerprint(offloaded) == whole, budget
    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(make_tiny("llama").config)
    with pytest.raises(ValueError, match=r"model.embed_tokens.weight of LlamaForCausalLM is on the meta device"):
        model_fingerprint(built)
