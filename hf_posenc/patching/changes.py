"""Module changes more than one planner makes (planners never import each other; they share these)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

ATTENTION = "_attn_implementation_internal"  # the config attribute behind config._attn_implementation


def masks_in_forward(model: nn.Module) -> None:
    """``generate()`` with a compileable (static) cache builds the attention masks before calling the model,
    and then needs tensors (it calls ``.contiguous()``; the forward passes on only 4D tensors and block
    masks as prepared). Masks that are neither (ALiBi's flex and cudnn masks, the extension methods' positions)
    cannot go that way, so for this model generate() passes the 2D mask on and the forward builds them, as it
    does with a dynamic cache."""
    model.create_masks_for_generate = _keep_2d_mask


def _keep_2d_mask(*, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor | None:
    return attention_mask
