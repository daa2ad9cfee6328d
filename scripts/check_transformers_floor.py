"""The oldest transformers the package declares runs the core of the test suite: the step of the test command after
``python -m pytest``.

Reads X of ``"transformers>=X,<6"`` in pyproject.toml, installs transformers X (without its dependencies: the venv's
tokenizers, huggingface_hub and torch) into ``.cache/transformers-X`` once, and runs the tests of the methods,
patching, the record and training with it first on ``PYTHONPATH`` (the real-model and GPU tests aside; transformers
4.x has its own test). Exit status: pytest's, or 1 where the install fails.

Usage: ``python scripts/check_transformers_floor.py [PYTEST_ARGS...]``
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ["tests/methods", "tests/patching", "tests/test_record.py", "tests/training"]
ELSEWHERE = "tests/patching/test_transformers4.py"  # transformers 4.x, in its own subprocess already


def declared_floor(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """X of ``"transformers>=X,<6"`` in ``pyproject``."""
    [floor] = re.findall(r'"transformers>=([0-9.]+),', pyproject.read_text(encoding="utf-8"))
    return floor


def install(requirement: str) -> Path:
    """``pip install --no-deps --target`` of ``requirement`` into ``.cache/``, once; into a temporary folder first and
    renamed into place, so an interrupted install is never used."""
    target = ROOT / ".cache" / requirement.replace("==", "-")
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=target.name + ".partial-", dir=target.parent))
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(partial), requirement]
    try:
        subprocess.run(command, check=True)
        partial.rename(target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


def main(argv: list[str]) -> int:
    """Install the floor and run the core of the suite with it (``argv``: more pytest arguments); the exit status."""
    floor = declared_floor()
    try:
        target = install(f"transformers=={floor}")
    except subprocess.CalledProcessError as error:
        print(f"check_transformers_floor: pip could not install transformers=={floor} ({error})", file=sys.stderr)
        return 1
    paths = [str(target), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    version = subprocess.run(
        [sys.executable, "-c", "import transformers; print(transformers.__version__)"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    if version != floor:
        print(f"check_transformers_floor: imports transformers {version}, not the floor {floor}", file=sys.stderr)
        return 1
    print(f"transformers {floor} (the declared floor), from {target}:", flush=True)
    command = [sys.executable, "-m", "pytest", "-q", "-m", "not slow and not gpu", "-p", "no:cacheprovider"]
    return subprocess.run([*command, "--deselect", ELSEWHERE, *argv, *CORE], cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
