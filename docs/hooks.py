"""MkDocs hooks: the API reference's pages, and MathJax served with the site.

- The docstrings' Sphinx roles (``:func:`~hf_posenc.patch` ``), which the handler leaves as text, become
  cross-references: code naming the object (its last component where the role writes ``~``), linked by
  mkdocs-autorefs to where the reference documents it, plain code where it documents it nowhere.
- A parameter's type as the docstring writes it (``(`str` or `MethodSpec`)``) is shown without its backticks in
  the type column, which sets it as code already.
- MathJax (the ``django-static-mathjax`` package of the ``docs`` extra) is copied into the built site, so that the
  formulas render where no CDN can be reached: its TeX-to-HTML component, its fonts and its licence.
"""

from __future__ import annotations

import re
import shutil
from importlib import resources
from pathlib import Path

from mkdocs.exceptions import PluginError

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


MATHJAX_FOLDER = "javascripts/mathjax"  # where mkdocs.yml's extra_javascript finds tex-mml-chtml.js
# the combined component, its fonts, and what it loads on demand: TeX extensions, the menu, accessibility and speech
_MATHJAX_FILES = ("tex-mml-chtml.js", "output/chtml/fonts/woff-v2", "input/tex/extensions", "ui", "a11y", "sre")


def on_post_build(config, **kwargs) -> None:
    try:
        root = Path(str(resources.files("mathjax"))) / "static" / "mathjax"
        target = Path(config["site_dir"]) / MATHJAX_FOLDER
        for name in _MATHJAX_FILES:
            source, copy = root / "es5" / name, target / name
            copy.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, copy, dirs_exist_ok=True)
            else:
                shutil.copyfile(source, copy)
        shutil.copyfile(root / "LICENSE", target / "LICENSE")
    except (ModuleNotFoundError, OSError) as error:
        message = f"MathJax 3 (django-static-mathjax) cannot be copied ({error}): pip install -e '.[docs]'."
        raise PluginError(message) from error
