"""MkDocs hooks on the API reference's pages.

- The docstrings' Sphinx roles (``:func:`~hf_posenc.patch` ``), which the handler leaves as text, become
  cross-references: code naming the object (its last component where the role writes ``~``), linked by
  mkdocs-autorefs to where the reference documents it, plain code where it documents it nowhere.
- A parameter's type as the docstring writes it (``(`str` or `MethodSpec`)``) is shown without its backticks in
  the type column, which sets it as code already.
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj):<code>(~?)([^<]+)</code>")
_TYPE_CELL = re.compile(r"(<td>\s*<code>)([^<]*`[^<]*)(</code>\s*</td>)")


def _reference(match: re.Match) -> str:
    name = match.group(2)
    shown = name.rsplit(".", 1)[-1] if match.group(1) else name
    return f'<autoref identifier="{name}" optional><code>{shown}</code></autoref>'


def _plain_type(match: re.Match) -> str:
    return match.group(1) + match.group(2).replace("`", "") + match.group(3)


def on_page_content(html: str, **kwargs) -> str:
    return _TYPE_CELL.sub(_plain_type, _ROLE.sub(_reference, html))
