"""A short hash of a model's weights as loaded: what results files (:mod:`hf_posenc.eval`) and training runs
(:mod:`hf_posenc.training.checkpoints`) keep, so that a resume notices a model retrained or replaced under its name."""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from ..patching.wrappers import offloaded_values
from .saved import saved_tensors

FINGERPRINT_SAMPLES = 1024  # values read from each tensor for :func:`model_fingerprint`


@torch.no_grad()
def model_fingerprint(model: nn.Module, samples: int = FINGERPRINT_SAMPLES) -> str:
    """A short SHA-256 of the base model as loaded: each parameter's and buffer's name, shape and dtype, and
    ``samples`` evenly spaced values of each (RoPE's ``inv_freq`` is a buffer: ``rope_theta`` and a shipped
    scaling count), with a saved patch's added tensors (:func:`~hf_posenc.hub.saved.saved_tensors`: a trained T5 table).
    A results file keeps it, so that a resume notices a model retrained or replaced under the same name. A tensor
    offloaded by a ``device_map`` (on the meta device, its values in accelerate's hook) is read from the hook, so
    the fingerprint is the model's placed whole. Raises ``ValueError`` for a tensor whose values are nowhere (a
    model built on the meta device)."""
    digest = hashlib.sha256()
    named = [*model.named_parameters(), *model.named_buffers(), *sorted(saved_tensors(model).items())]
    for name, tensor in named:
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
        flat = (offloaded_values(model, name) if tensor.is_meta else tensor).reshape(-1)
        if not flat.numel():
            continue
        count = min(samples, flat.numel())
        index = torch.arange(count, device=flat.device) * (flat.numel() - 1) // max(count - 1, 1)
        digest.update(flat[index].double().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]
