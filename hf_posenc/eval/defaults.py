"""What an evaluation does when not told otherwise, and the bounds of its options: light to import, so that the
command line's help reads them without torch."""

from __future__ import annotations

DEFAULT_METHODS = ("none", "yarn:factor=4")
# positions per slice of the MLPs and norms of a long window (:mod:`hf_posenc.eval.position_wise`); 0: one call
DEFAULT_SEQUENCE_SLICE = 4096
MIN_SEQUENCE_SLICE = 256  # slices of fewer rows than ~34 take other matrix kernels on CPU: not bitwise
MAX_TRIALS = 10_000  # passkey keys per (length, depth); each is a forward per method
# transformers' attention implementations a base model can be loaded with
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3")


def check_sequence_slice(size: object) -> None:
    """Raises `ValueError` unless ``size`` is 0 (one call) or a whole number of positions >= ``MIN_SEQUENCE_SLICE``."""
    if isinstance(size, bool) or not isinstance(size, int) or (size != 0 and size < MIN_SEQUENCE_SLICE):
        raise ValueError(
            f"The sequence slice must be 0 (one call) or a whole number of positions >= {MIN_SEQUENCE_SLICE}, "
            f"got {size!r}."
        )
