"""The oldest transformers the package declares runs the suite's core: methods, patching, the config round trip,
ALiBi and the other attention methods, and training (in a subprocess, that release installed beside the venv's
newest one).

pyproject.toml declares ``transformers>=X``; this test reads X from there, so the declared floor is the tested one.
huggingface_hub 2, which the package requires, caps it: transformers 5.18 is the first release that accepts it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from helpers import pip_target

from hf_posenc._startup import TRANSFORMERS_FLOOR

ROOT = Path(__file__).resolve().parents[1]
CORE = ["tests/methods", "tests/patching", "tests/test_record.py", "tests/training"]
ELSEWHERE = "tests/patching/test_transformers4.py"  # transformers 4.x, in its own subprocess already


def declared_floor() -> str:
    """X of ``"transformers>=X,<6"`` in pyproject.toml."""
    [floor] = re.findall(r'"transformers>=([0-9.]+),', (ROOT / "pyproject.toml").read_text())
    return floor


def test_the_declared_floor_runs_the_core_of_the_suite():
    floor = declared_floor()
    target = pip_target(f"transformers=={floor}", no_deps=True)  # the venv's tokenizers, huggingface_hub, torch
    env = {**os.environ, "PYTHONPATH": str(target), "OMP_NUM_THREADS": "1"}
    version = subprocess.run(
        [sys.executable, "-c", "import transformers; print(transformers.__version__)"],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    assert version.stdout.strip() == floor
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-x",
        "-n",
        "0",
        "-m",
        "not slow and not gpu",
        "-p",
        "no:cacheprovider",
    ]
    done = subprocess.run(
        [*command, "--deselect", ELSEWHERE, *CORE], cwd=ROOT, capture_output=True, text=True, env=env, timeout=900
    )
    assert done.returncode == 0, f"transformers {floor}:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    assert re.search(r"\d+ passed", done.stdout.splitlines()[-1]), done.stdout[-500:]


def test_the_floor_checked_at_import_is_the_declared_one():
    assert declared_floor() == TRANSFORMERS_FLOOR


def test_a_transformers_below_the_floor_is_named_at_import():
    """transformers 4 on the path (``PYTHONPATH``): ``import hf_posenc`` says what it needs, rather than every patch
    failing later on "per-layer RoPE parameters ([])"."""
    target = pip_target("transformers==4.57.6")  # tests/patching/test_transformers4.py's copy
    env = {**os.environ, "PYTHONPATH": str(target), "PYTHONNOUSERSITE": "1"}
    done = subprocess.run([sys.executable, "-c", "import hf_posenc"], capture_output=True, text=True, env=env)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"ImportError: hf_posenc needs transformers>={TRANSFORMERS_FLOOR}; this Python imports transformers 4.57.6 "
        f"from {target / 'transformers'}. Upgrade it: pip install 'transformers>={TRANSFORMERS_FLOOR},<6'."
    )
