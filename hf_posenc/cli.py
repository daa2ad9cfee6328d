"""The ``hf-posenc`` command: each module in ``COMMAND_MODULES`` adds its subcommands.

A command module exposes ``add_parser(subparsers)``; each subcommand it adds sets ``func``, called
with the parsed arguments and returning the exit status.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES = ("hf_posenc.eval_cli", "hf_posenc.hub_cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-posenc",
        description="Change how a pretrained Hugging Face model encodes position, and measure it.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (ValueError, TypeError, OSError, NotImplementedError) as error:  # bad input, files, model loading
        print(f"hf-posenc {args.command}: error: {error}", file=sys.stderr)
        return 2
