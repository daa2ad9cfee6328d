"""The oldest transformers the package declares: named at import when an older one is found, and the core of the
suite run with it by the step of the test command after pytest (``scripts/check_transformers_floor.py``, which
reads the floor from pyproject.toml, so the declared floor is the tested one).

huggingface_hub 2, which the package requires, caps it: transformers 5.18 is the first release that accepts it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from helpers import pip_target

from hf_posenc._startup import TRANSFORMERS_FLOOR

ROOT = Path(__file__).resolve().parents[1]
TEST_COMMAND_END = "python -m pytest -q && python scripts/check_transformers_floor.py"


def _floor_script():
    spec = importlib.util.spec_from_file_location(
        "check_transformers_floor", ROOT / "scripts/check_transformers_floor.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def declared_floor() -> str:
    return _floor_script().declared_floor()


def test_the_test_command_runs_the_core_with_the_floor_after_the_suite():
    """The README's test command and CI's are one, and its last step is the floor's run."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci/run").read_text(encoding="utf-8")
    [command] = [line for line in readme.splitlines() if line.startswith("python3 -m venv .venv &&")]
    assert command.endswith(TEST_COMMAND_END) and command in ci
    script = _floor_script()
    assert all((ROOT / path).exists() for path in [*script.CORE, script.ELSEWHERE])


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
