"""``hf-posenc methods [NAME]``: every method, or one method's parameters, defaults and paper, from the registry
and each parameter's own help (:mod:`hf_posenc.fields`)."""

from __future__ import annotations

import argparse
import dataclasses
import textwrap

EPILOG = """\
examples:
  hf-posenc methods                 # every method: name, aliases, what it changes, when to use it
  hf-posenc methods yarn            # its parameters, as --method yarn:factor=4,beta_fast=32 takes them
  hf-posenc methods self-extend+logn
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``methods``."""
    command = subparsers.add_parser(
        "methods",
        help="the methods, or one method's parameters",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_argument("name", nargs="?", help="a method or alias (a combination: yarn+logn)")
    command.set_defaults(func=methods_command)


def methods_command(args: argparse.Namespace) -> int:
    from ..registry import available_methods, get_method

    if args.name is None:
        for name in available_methods():
            method = get_method(name)
            aliases = f" ({', '.join(method.aliases)})" if method.aliases else ""
            print(f"{name}{aliases}  [{method.role}]")
            print(textwrap.fill(method.summary, width=100, initial_indent="    ", subsequent_indent="    "))
        print("\nhf-posenc methods NAME lists a method's parameters.")
        return 0
    print(describe(get_method(args.name)))
    return 0


def describe(method) -> str:
    """A method's name, paper and summary, then each parameter: type, default and help."""
    from ..fields import field_help

    lines = [method.name, *(f"  {part.name}: {part.paper}" for part in method.parts)] if method.parts else []
    if not method.parts:
        lines = [f"{method.name}: {method.paper}"]
        lines += textwrap.wrap(method.summary, width=100)
    helps = {name: text for part in method.components for name, text in field_help(part.params).items()}
    lines.append("\nparameters:" if dataclasses.fields(method.params) else "\nno parameters")
    for item in dataclasses.fields(method.params):
        required = item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING
        default = "required" if required else f"default {item.default!r}"
        lines.append(f"  {item.name} ({item.type}; {default})")
        text = helps.get(item.name, "")
        lines += textwrap.wrap(text, 100, initial_indent="      ", subsequent_indent="      ", break_on_hyphens=False)
    return "\n".join(lines)
