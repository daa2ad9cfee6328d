"""Tiny random causal LMs of each supported family, built from a config (seeded, float32, eval mode): what the
unit tests patch."""

from __future__ import annotations

import copy

import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

TINY = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)

CONFIGS = {  # each call its own copy of TINY: a test that edits its config's rope_parameters changes no other's
    "llama": lambda: LlamaConfig(**copy.deepcopy(TINY)),
    "mistral": lambda: MistralConfig(**copy.deepcopy(TINY), sliding_window=None),
    "qwen2": lambda: Qwen2Config(**copy.deepcopy(TINY)),
    "qwen3": lambda: Qwen3Config(**copy.deepcopy(TINY), head_dim=16),
}


def make_tiny(family: str, *, seed: int = 0, attn_implementation: str = "eager", **overrides):
    """A tiny random causal LM of ``family`` (weights seeded, float32, eval mode)."""
    if family == "gpt2":
        defaults = dict(vocab_size=97, n_embd=64, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)
        config = GPT2Config(**{**defaults, **overrides})
    else:
        config = CONFIGS[family]()
        for key, value in overrides.items():
            setattr(config, key, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    return model.eval()
