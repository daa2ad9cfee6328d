"""MkDocs hooks: the docstrings' Sphinx roles (``:func:`~hf_posenc.patch` ``), which the API reference's handler
leaves as text, shown as code naming the object (its last component where the role writes ``~``)."""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj):<code>(~?)([^<]+)</code>")


def _named(match: re.Match) -> str:
    name = match.group(2)
    return f"<code>{name.rsplit('.', 1)[-1] if match.group(1) else name}</code>"


def on_page_content(html: str, **kwargs) -> str:
    return _ROLE.sub(_named, html)
