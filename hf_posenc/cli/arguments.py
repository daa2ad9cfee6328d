"""Argument types and process helpers the commands share: light to import (no torch until a command runs)."""

from __future__ import annotations

import argparse

from ..eval.data import parse_length, parse_lengths


def end_processes() -> None:
    """Under ``accelerate launch``: every process finishes together and closes the process group, or one
    can abort at exit ("terminate called without an active exception") while another still uses it."""
    from accelerate import PartialState

    state = PartialState()
    state.wait_for_everyone()
    state.destroy_process_group()


def is_main_process() -> bool:
    """Whether this is the process that prints and writes (the only one outside ``accelerate launch``)."""
    from accelerate import PartialState

    return PartialState().is_main_process


def positive_int(text: str) -> int:
    """An argument type: a whole number above 0."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def token_lengths(text: str) -> list[int]:
    """An argument type: comma-separated lengths in tokens (``2k,8k``, k = 1024)."""
    try:
        return parse_lengths(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def token_length(text: str) -> int:
    """An argument type: one length in tokens (``16k``, k = 1024)."""
    try:
        return parse_length(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error
