"""``hf-posenc tune``: parse, call :func:`hf_posenc.tuning.run_tune`, print the ranked table."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..files import default_output
from .arguments import end_processes, is_main_process, positive_int, token_length, token_lengths
from .eval import add_data_arguments, add_model_source_arguments, text_source_of
from .model_options import model_source_of, reads_cache_if_unreachable

TUNE_EPILOG = """\
Every training-free family that can take the model from its trained context L to --target-length T
(YaRN and NTK at T/L and twice it, dynamic YaRN and NTK, Self-Extend with the smallest group size
that reaches T and the next, DCA, STRING where it reaches, ReRoPE and Leaky ReRoPE; each with log-n
too, where it combines) is scored on the same documents, truncate protocol: perplexity at T, and at
L/4 and L against the unpatched model (the regression). A method whose output does not depend on the
input's length needs one forward per document at T; the shorter lengths are read from it.

The winner is the lowest perplexity at T among candidates whose regression stays within
--max-regression; candidates within two paired standard errors of it (blocks of tokens, the same
tokens for every candidate) are reported as tied (rank =1), not ranked below it.

--budget N screens every candidate on the first window at (L + T) / 2 tokens and runs the N best in
full: one shorter forward per candidate, then one per kept candidate and document at T.

The folder holds tune.json, tune.csv and tune.png, the winner as a config-only folder (best/: the
patched config, the tokenizer and a card; hf_posenc.from_pretrained loads it with the base's weights,
hf-posenc push --model shares it; not for a GGUF model, whose weights a folder cannot name), and the
perplexity run (perplexity/, screening/):
rerun the same command to resume a killed tune, or widen --methods to add candidates (only the new
ones are computed).

examples:
  hf-posenc tune
  hf-posenc tune --model Qwen/Qwen2.5-0.5B --target-length 32k --dataset emozilla/pg19-test --streaming \\
      --max-documents 8
  hf-posenc tune --budget 6 --methods yarn,self-extend,dca --output tune-qwen
"""


def add_parser(subparsers) -> None:
    """Register ``tune``."""
    tune = subparsers.add_parser(
        "tune",
        help="the best training-free extension of a model to a length, measured",
        epilog=TUNE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_source_arguments(tune)
    tune.add_argument("--target-length", type=token_length, help="k = 1024 (default: twice the trained context)")
    tune.add_argument("--methods", type=_families, help="comma-separated families to search (default: all)")
    tune.add_argument("--budget", type=positive_int, help="run at most N candidates in full, after a screening")
    tune.add_argument(
        "--max-regression",
        type=float,
        default=0.03,
        help="largest perplexity increase inside the trained context a winner may have (default: 0.03, 3%%)",
    )
    tune.add_argument(
        "--short-lengths", type=token_lengths, help="lengths inside L for the regression (default: L/4,L)"
    )
    tune.add_argument("--no-logn", action="store_true", help="leave out the log-n combinations")
    tune.add_argument(
        "--passkey",
        nargs="?",
        const=2,
        default=0,
        type=positive_int,
        metavar="N",
        help="passkey accuracy at the target of every candidate run in full, N keys at depths 0, 0.5 and 1 "
        "(N default: 2)",
    )
    tune.add_argument("--batch-size", type=positive_int, default=1, help="windows per forward (default: 1)")
    add_data_arguments(tune)
    tune.add_argument("--output", type=Path, help="the tune's folder (default: hf-posenc-results/tune-<model>)")
    tune.set_defaults(
        func=tune_command,
        parameter_flags={"config": "--dataset-config", "methods": "--methods", "lengths": "--target-length"},
        interrupted="interrupted: the finished candidates are kept in {output}; rerun the same command to resume.",
    )


def _families(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r} names no family (example: yarn,self-extend,dca)")
    return names


@reads_cache_if_unreachable
def tune_command(args: argparse.Namespace) -> int:
    from ..tuning.search import TuneConfig, run_tune

    config = TuneConfig(
        target_length=args.target_length,
        methods=args.methods,
        budget=args.budget,
        max_regression=args.max_regression,
        short_lengths=args.short_lengths,
        logn=not args.no_logn,
        batch_size=args.batch_size,
        passkey_trials=args.passkey,
    )
    model_source = model_source_of(args)
    text_source = text_source_of(args)
    output = args.output = args.output or default_output("tune", model_source.gguf_file or model_source.name)
    report = run_tune(model_source, text_source, config, output)
    end_processes()
    if is_main_process():
        print(f"\nCandidates at {report.target_length} tokens (trained context {report.trained_context}), best first:")
        print(report.table())
        best = report.best
        tied = report.tied_with_best
        print(f"\nBest: {best.text if best else 'none within --max-regression'}", end="")
        print(f" (tied within noise: {', '.join(tied)})" if tied else "")
        print(f"Results: {output / 'tune.json'} and tune.csv\nPlot:    {output / 'tune.png'}")
        if (output / "best").is_dir():
            from ..hub.metadata import read_metadata

            gguf = "base_gguf_file" in (read_metadata(str(output / "best")) or {})
            share = "push_to_hub with_weights=True" if gguf else "hf-posenc push --model"
            print(f"Winner:  {output / 'best'} (config only: hf_posenc.from_pretrained, {share})")
    return 0
