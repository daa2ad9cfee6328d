"""Names from results files written into a model card's markdown, as literal text.

A task, metric, model or dataset name in ``results.json`` or ``lm_eval.json`` may hold what markdown reads as
syntax: a ``|`` ends a table cell, a newline ends the table row (or the sentence's paragraph), a backtick opens or
closes inline code. The card's template writes such names through :func:`markdown_text` or :func:`markdown_code`.
"""

from __future__ import annotations

import re
from typing import Any

# what starts markdown syntax inside a line: backslash escapes, code, table cells, emphasis, links, HTML
_SYNTAX = re.compile(r"([\\`|*\[\]<])")
_BACKTICKS = re.compile(r"`+")


def _one_line(value: Any) -> str:
    return " ".join(str(value).splitlines())


def markdown_text(value: Any) -> str:
    """``value`` as literal text in a table cell or a sentence: on one line (line breaks become spaces), each of
    ``\\ ` | * [ ] <`` escaped with a backslash."""
    return _SYNTAX.sub(r"\\\1", _one_line(value))


def markdown_code(value: Any) -> str:
    """``value`` as inline code on one line: fenced by one backtick more than its longest run of backticks, with a
    space inside each fence where it begins or ends with a backtick or a space (which the fences would take)."""
    text = _one_line(value)
    fence = "`" * (max((len(run) for run in _BACKTICKS.findall(text)), default=0) + 1)
    pad = " " if text[:1] in ("`", " ") or text[-1:] in ("`", " ") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
