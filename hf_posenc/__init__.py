"""hf_posenc: change how a pretrained transformers model encodes position, and measure it."""

from __future__ import annotations

__version__ = "0.1.0"
