#!/usr/bin/env bash
# The wheels scripts/gpu_run.sh installs on the device tool's GPU machine, into the ignored .whl/ (carry it):
# what its image lacks or has older than the project needs (transformers above the floor, huggingface_hub 2,
# datasets for the eval tests, the cuDNN frontend, peft for tests/patching/test_wrappers.py), at the versions
# installed in this checkout's venv.
#   bash scripts/gpu_wheels.sh [python]       # default: .venv/bin/python
set -euo pipefail
PYTHON="${1:-.venv/bin/python}"
PACKAGES=(transformers huggingface_hub tokenizers safetensors hf-xet httpx2 httpcore2 truststore click
    datasets dill multiprocess nvidia-cudnn-frontend peft)
mapfile -t PINNED < <("$PYTHON" -c 'import sys
from importlib.metadata import version
print("\n".join(f"{name}=={version(name)}" for name in sys.argv[1:]))' "${PACKAGES[@]}")
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
rm -rf .whl
PLATFORMS=()
for tag in manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux_2_35; do
    PLATFORMS+=(--platform "${tag}_x86_64")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 "${PLATFORMS[@]}" -d .whl "${PINNED[@]}"
ls .whl
du -sh .whl
