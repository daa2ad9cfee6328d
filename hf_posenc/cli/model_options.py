"""How a command's ``--model`` is loaded (eval, passkey, lm-eval, train): the options besides its file, the
:class:`~hf_posenc.eval.models.ModelSource` they describe, and a run that reads the cache alone where the Hub cannot
be reached."""

from __future__ import annotations

import argparse
import functools
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..eval.defaults import ATTN_IMPLEMENTATIONS
from ..hub.reach import cache_only_if_unreachable

if TYPE_CHECKING:
    from ..eval.models import ModelSource


def add_loading_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """How ``--model`` is loaded besides its file and dtype (eval, passkey, lm-eval): ``ModelSource``'s fields."""
    parser.add_argument("--revision", help="branch, tag or commit of a Hub --model (default: main)")
    parser.add_argument(
        "--attn-implementation",
        choices=ATTN_IMPLEMENTATIONS,
        help="transformers' attention of the base model (default: its own, sdpa for most); ALiBi and the T5 bias "
        "pick their backend with the method (alibi:backend=flex)",
    )
    parser.add_argument(
        "--device-map",
        choices=("auto", "balanced", "balanced_low_0", "sequential"),
        help="split one model over this machine's GPUs (accelerate's big-model inference; run one process, not "
        "accelerate launch)",
    )
    parser.add_argument(
        "--max-memory",
        type=max_memory,
        metavar="DEVICE=SIZE,...",
        help="with --device-map: each device's budget, e.g. 0=70GiB,1=70GiB,cpu=200GiB",
    )


def add_dtype_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--dtype`` of the evaluated model (eval, passkey, lm-eval)."""
    parser.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16", "float16"),
        default="auto",
        help="dtype of the weights and the forward (default: auto: bfloat16 on a GPU, float32 on a CPU)",
    )


def model_source_of(args: argparse.Namespace) -> ModelSource:
    """The :class:`~hf_posenc.eval.models.ModelSource` of ``--model`` and the options that say how to load it."""
    from ..eval.models import ModelSource

    return ModelSource.named(args.model, args.gguf_file, args.dtype, **loading(args))


def reads_cache_if_unreachable(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``command``, reading huggingface_hub's cache alone where ``--model`` is a Hub id and the Hub cannot be reached
    (:func:`~hf_posenc.hub.reach.cache_only_if_unreachable`: a cached model loads at once, without retries)."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        with cache_only_if_unreachable(args.model, getattr(args, "revision", None)):
            return command(args)

    return run


def loading(args: argparse.Namespace) -> dict:
    """How to load ``--model``, from the options a command has (train has none of them)."""
    names = ("revision", "attn_implementation", "device_map", "max_memory")
    return {name: getattr(args, name, None) for name in names}


def max_memory(text: str) -> dict[int | str, str]:
    """``0=70GiB,cpu=200GiB`` -> ``{0: "70GiB", "cpu": "200GiB"}`` (accelerate's ``max_memory``)."""
    budgets: dict[int | str, str] = {}
    for part in text.split(","):
        device, _, size = part.strip().partition("=")
        if not device or not re.fullmatch(r"\d+(\.\d+)?\s*[KMGT]i?B", size.strip(), re.IGNORECASE):
            raise argparse.ArgumentTypeError(f"{part!r} is not DEVICE=SIZE (0=70GiB, cpu=200GiB)")
        budgets[int(device) if device.isdigit() else device] = size.strip()
    return budgets
