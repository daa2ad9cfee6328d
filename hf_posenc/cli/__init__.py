"""The ``hf-posenc`` command: each module in ``COMMAND_MODULES`` adds its subcommands.

A command module exposes ``add_parser(subparsers)``; each subcommand it adds sets ``func``, called with
the parsed arguments and returning the exit status.

Library functions raise errors that speak Python: a parameter they name is written in backticks
(`` `output` ``). Here each backticked name of a parameter of the command becomes its flag (``--output``):
the argparse destination of each option, plus the names a command maps itself (``parameter_flags``).

A command module imports at its top only what its parser needs (``--help`` and a mistyped option answer without
torch); what a command runs is imported when it runs.

Every message printed goes through :func:`hf_posenc.hub.errors.redact` (a server may echo the token). Ctrl-C
exits 130 with one line: the command's ``interrupted`` default, its ``{output}`` filled with ``--output``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import re
import sys
from collections.abc import Iterator

from safetensors import SafetensorError

from .._startup import INTERRUPTED_EXIT, quiet_interrupt
from ..hub.errors import HubError, redact

COMMAND_MODULES = (
    "hf_posenc.cli.eval",
    "hf_posenc.cli.share",
    "hf_posenc.cli.train",
    "hf_posenc.cli.plot",
    "hf_posenc.cli.lm_eval",
    "hf_posenc.cli.check",
    "hf_posenc.cli.methods",
    "hf_posenc.cli.tune",
)
_PARAMETER = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")
INTERRUPTED = "interrupted."


class _Parser(argparse.ArgumentParser):
    """A usage error in one line, as every other error of the command (not argparse's usage block first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message.rstrip('.')}; see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hf-posenc",
        description="Change how a pretrained Hugging Face model encodes position, and measure it.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(subparsers)
    for command in subparsers.choices.values():
        command.set_defaults(flags=flag_names(command))
    return parser


def flag_names(command: argparse.ArgumentParser) -> dict[str, str]:
    """Python parameter name -> the flag that sets it: every option's destination (argparse lists them only
    in ``_actions``; of ``-o``/``--output`` and ``--bf16``/``--no-bf16``, the first long one), and the command's own
    ``parameter_flags`` default (library parameters named otherwise)."""
    flags = {
        action.dest: next((flag for flag in action.option_strings if flag.startswith("--")), action.option_strings[0])
        for action in command._actions
        if action.option_strings
    }
    return {**flags, **(command.get_default("parameter_flags") or {})}


def with_flags(message: str, flags: dict[str, str]) -> str:
    """``message`` with each backticked parameter name that has a flag written as that flag."""
    return _PARAMETER.sub(lambda match: flags.get(match.group(1), match.group(0)), message)


def main(argv: list[str] | None = None) -> int:
    with quiet_interrupt():  # the parser, then (seconds) what the command runs
        args = build_parser().parse_args(argv)
        load_library()
    try:
        with notes_on_stderr():
            return args.func(args) or 0
    except KeyboardInterrupt:
        output = getattr(args, "output", None) or "the output folder"
        _report(args, (getattr(args, "interrupted", None) or INTERRUPTED).format(output=output))
        return INTERRUPTED_EXIT
    except HubError as error:  # the Hub refused or failed: the input may be fine
        _report(args, str(error))
        return 1
    except (ValueError, TypeError, OSError, SafetensorError, NotImplementedError) as error:
        # bad input, files (safetensors' own error: a weights file written to a full disk), model loading
        _report(args, f"error: {error}")
        return 2


@contextlib.contextmanager
def notes_on_stderr() -> Iterator[None]:
    """Within the block, what the library notes at INFO (the trained context a method assumed) is printed on stderr,
    one line each; a program importing hf_posenc sees it only where it asks (``logging`` at INFO)."""
    logger = logging.getLogger("hf_posenc")
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.INFO)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(min(level or logging.INFO, logging.INFO))
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def load_library() -> None:
    """What ``import hf_posenc`` does outside the command, done once its arguments are parsed: the methods registered,
    and hf_posenc's rope types and attention backends registered with transformers (seconds of torch)."""
    for module in ("hf_posenc.methods", "hf_posenc.patching"):
        importlib.import_module(module)


def _report(args: argparse.Namespace, message: str) -> None:
    """One line on stderr: ``message`` with flags for parameter names, and no token (``--token`` or the login's)."""
    lines = (line.strip() for line in message.splitlines())  # a library's message may span several
    shown = redact(with_flags(" ".join(line for line in lines if line), args.flags), getattr(args, "token", None))
    print(f"hf-posenc {args.command}: {shown}", file=sys.stderr)
