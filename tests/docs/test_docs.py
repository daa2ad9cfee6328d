"""The README and the documentation site cannot rot: the site builds with ``mkdocs build --strict`` (a broken link,
a missing reference or a docstring the handler cannot parse fails it), every Python example runs (offline, on the
CPU), and every command line parses.

A Python block that needs what the tests do not have starts with ``# needs: hub`` (or ``gpu``, ``long``): it is
reported as a skipped test naming the block. The blocks of one page run in order, in a namespace and a folder of
its own; the pages share one fresh interpreter.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hf_posenc.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_NEEDS = re.compile(r"^# needs: (\w+)")


def _blocks(page: Path, language: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(page.read_text(encoding="utf-8")) if lang == language]


def _needs(block: str) -> str | None:
    found = _NEEDS.match(block)
    return found.group(1) if found else None


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


RUNNABLE = [page for page in PAGES if any(_needs(block) is None for block in _blocks(page, "python"))]
MARKED = [(page, index) for page in PAGES for index, block in enumerate(_blocks(page, "python")) if _needs(block)]


def test_the_site_builds_strict(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    assert api.count("doc-heading") > 20
    # a docstring's Sphinx role (:func:`hf_posenc.get_patch`) is a link to the object's entry (docs/hooks.py)
    assert 'href="#hf_posenc.patching.apply.get_patch"><code>hf_posenc.get_patch</code></a>' in api
    assert ":func:" not in api
    assert "<code>str or MethodSpec</code>" in api and "<code>`str`" not in api  # a type cell, without backticks
    # the formulas render offline: MathJax is served with the site, no page loads a script from elsewhere
    mathjax = tmp_path / "site" / "javascripts" / "mathjax"
    assert (mathjax / "tex-mml-chtml.js").stat().st_size > 500_000 and list((mathjax / "output").rglob("*.woff"))
    rope = (tmp_path / "site" / "rope-scaling" / "index.html").read_text(encoding="utf-8")
    assert '<script src="../javascripts/mathjax/tex-mml-chtml.js">' in rope and 'class="arithmatex"' in rope
    pages = [page.read_text(encoding="utf-8") for page in (tmp_path / "site").rglob("*.html")]
    assert not [page for page in pages if re.search(r'<script[^>]+src="(https?:)?//', page)]
    assert not (tmp_path / "site" / "hooks.py").exists()


# Every page's examples in one interpreter, each page in a namespace and a folder of its own: one import of torch
# and transformers for all of them. The pages' tests share its results, so they run on one worker.
_RUN_PAGES = """
import json, os, sys, traceback
pages, results = json.load(open(sys.argv[1])), {}
for name, (code, folder) in pages.items():
    os.chdir(folder)
    try:
        exec(compile(code, name, "exec"), {"__name__": "__main__"})
        results[name] = None
    except BaseException:
        results[name] = traceback.format_exc()[-4000:]
json.dump(results, open(sys.argv[2], "w"))
"""


@pytest.fixture(scope="session")
def example_failures(tmp_path_factory) -> dict[str, str | None]:
    """Page -> the traceback of its examples, run in order (None: they ran). Once a session: the worker that runs
    the pages' tests may take them in more than one batch."""
    root = tmp_path_factory.mktemp("examples")
    pages = {}
    for page in RUNNABLE:
        folder = root / _name(page).replace("/", "_")
        folder.mkdir()
        pages[_name(page)] = ("\n\n".join(b for b in _blocks(page, "python") if _needs(b) is None), str(folder))
    (root / "pages.json").write_text(json.dumps(pages))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    command = [sys.executable, "-c", _RUN_PAGES, str(root / "pages.json"), str(root / "results.json")]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((root / "results.json").read_text())


@pytest.mark.xdist_group("docs-examples")
@pytest.mark.parametrize("page", RUNNABLE, ids=_name)
def test_the_python_examples_run(page, example_failures):
    assert example_failures[_name(page)] is None, f"{_name(page)}:\n{example_failures[_name(page)]}"


@pytest.mark.parametrize(
    ("page", "index"), MARKED, ids=lambda value: _name(value) if isinstance(value, Path) else str(value)
)
def test_examples_that_need_the_hub_or_a_gpu_are_shown_not_run(page, index):
    block = _blocks(page, "python")[index]
    first = next((line for line in block.splitlines()[1:] if line.strip() and not line.startswith("#")), "")
    pytest.skip(f"{_name(page)}, example {index + 1} needs {_needs(block)}: {first.strip()[:80]}")


def _command_lines(page: Path) -> list[str]:
    """Each ``hf-posenc ...`` (or ``... -m hf_posenc ...``) command of the page's shell blocks, continuation lines
    joined, cut at ``&&``, ``|`` and comments."""
    commands = []
    for block in _blocks(page, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            for part in re.split(r"&&|\|", line):
                words = shlex.split(part, comments=True)
                if words[:1] == ["hf-posenc"]:
                    commands.append(words[1:])
                elif "hf_posenc" in words and words[words.index("hf_posenc") - 1] == "-m":
                    commands.append(words[words.index("hf_posenc") + 1 :])
    return commands


COMMANDS = [(page, " ".join(args)) for page in PAGES for args in _command_lines(page)]


def test_the_pages_show_commands():
    assert len(COMMANDS) > 20 and {args.split()[0] for _, args in COMMANDS} >= {"eval", "passkey", "train", "push"}


@pytest.mark.parametrize(
    ("page", "command"), COMMANDS, ids=lambda value: _name(value) if isinstance(value, Path) else value[:60]
)
def test_every_command_line_parses(page, command):
    args = shlex.split(command)
    try:
        build_parser().parse_args(args)
    except SystemExit as exit_:
        assert exit_.code == 0 and "--help" in args, f"{_name(page)}: hf-posenc {command}"


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_no_trailing_comment_widens_a_code_block(page):
    """A comment beside code that takes a line past 90 characters makes the block scroll sideways on the site: such
    comments go on the line above."""
    wide = [
        line
        for language in ("python", "bash")
        for block in _blocks(page, language)
        for line in block.splitlines()
        if len(line) > 90 and re.search(r"\S\s+# ", line)
    ]
    assert not wide, wide
