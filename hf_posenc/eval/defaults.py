"""What an evaluation does when not told otherwise, and the bounds of its options: light to import, so that the
command line's help reads them without torch."""

from __future__ import annotations

DEFAULT_METHODS = ("none", "yarn:factor=4")
MAX_TRIALS = 10_000  # passkey keys per (length, depth); each is a forward per method
# transformers' attention implementations a base model can be loaded with
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3")
