#!/usr/bin/env bash
# The CUDA path on a GPU machine with torch + transformers preinstalled and no network:
# installs the wheels carried in .whl/ (pyzmq, msgspec, fastapi, ...; no Ray), installs
# streamrl without dependencies, runs the GPU tests and the benchmarks, and writes logs to
# $OUT (or ./gpu-out). Usage: scripts/gpu_check.sh [tests|learner|generator|weights|lora|all]...
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
PY="${PY:-python3}"
export PYTHONUNBUFFERED=1 STREAMRL_HOME="${STREAMRL_HOME:-/tmp/streamrl-home}"

if [ -d .whl ] && ! "$PY" -c "import zmq, msgspec" 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
# Editable, as scripts/setup.sh does: its import finder maps streamrl.workers -> workers/.
"$PY" -c "import streamrl.workers" 2>/dev/null || "$PY" -m pip install -q --no-index --no-deps \
    --no-build-isolation -e . || exit 1

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
    | tee -a "$OUT/device.txt"

run_tests() {
    "$PY" -m pytest -q -m gpu -p no:cacheprovider -o addopts="--strict-markers" tests/gpu \
        tests/unit/test_losses.py tests/unit/test_advantages.py tests/unit/test_kl.py \
        tests/unit/test_reward_shaping.py -rs -s 2>&1 | tee "$OUT/pytest-gpu.log"
}
run_learner() {
    "$PY" benchmarks/learner.py --model random-smollm2-135m --device cuda --batch 64 \
        --micro-batch 32 --prompt-tokens 256 --response-tokens 256 --steps 5 \
        --json "$OUT/learner-135m.json" 2>&1 | grep -v "Loading weights" | tee "$OUT/learner.log"
    "$PY" benchmarks/learner.py --model random-llama-1b --device cuda --batch 32 \
        --micro-batch 8 --prompt-tokens 256 --response-tokens 256 --steps 4 --profile \
        --json "$OUT/learner-1b.json" 2>&1 | grep -v "Loading weights" | tee -a "$OUT/learner.log"
}
run_generator() {
    "$PY" benchmarks/generator.py --model random-smollm2-135m --device cuda --batches 8,64,256 \
        --new-tokens 128 --json "$OUT/generator.json" 2>&1 | tee "$OUT/generator.log"
    # The same through transformers' forward: what FastDecoder saves on a GPU.
    "$PY" benchmarks/generator.py --model random-smollm2-135m --device cuda --batches 8,64,256 \
        --new-tokens 128 --no-fast-decode --json "$OUT/generator-transformers.json" 2>&1 \
        | tee "$OUT/generator-transformers.log"
}
run_lora() {
    # LoRA (r = 16) against full fine-tuning on one GPU: step time, peak memory, bytes/update.
    "$PY" benchmarks/lora.py --model random-smollm2-135m --device cuda --batch 64 \
        --micro-batch 32 --prompt-tokens 256 --response-tokens 256 --no-spread --steps 5 \
        --threads 4 --json "$OUT/lora-135m.json" 2>&1 | grep -v "Loading weights" | tee "$OUT/lora.log"
    "$PY" benchmarks/lora.py --model random-llama-1b --device cuda --batch 32 \
        --micro-batch 8 --prompt-tokens 256 --response-tokens 256 --no-spread --steps 4 \
        --threads 4 --json "$OUT/lora-1b.json" 2>&1 | grep -v "Loading weights" | tee -a "$OUT/lora.log"
}
run_weights() {
    "$PY" benchmarks/weights.py --model random-smollm2-135m --device cuda --quick 2>&1 \
        | tee "$OUT/weights.log"
}
run_async() {
    # Ray's wheel (79 MB) is over what a call can carry: .whl-ray/ holds it without its Java
    # jars and dashboard client, unpacked here with the files' modes (its binaries run).
    if ! "$PY" -c "import ray" 2>/dev/null; then
        "$PY" - <<'PYEOF' || exit 1
import glob, os, zipfile
archive = zipfile.ZipFile(glob.glob(".whl-ray/ray-*-trimmed.zip")[0])
for info in archive.infolist():
    path = archive.extract(info, "/tmp/site")
    if info.external_attr >> 16:
        os.chmod(path, info.external_attr >> 16)
PYEOF
        "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
            .whl-ray/*.whl || exit 1
    fi
    "$PY" -m streamrl.cli bench throughput configs/gpu-bench.yaml --steps "${BENCH_STEPS:-20}" \
        --warmup 5 --staleness "${BENCH_ETAS:-2}" --out /tmp/bench 2>&1 | tee "$OUT/bench.log"
    cp /tmp/bench/results.json /tmp/bench/report.md /tmp/bench/*.png "$OUT/" 2>/dev/null
    "$PY" -m streamrl.cli bench simulate --from /tmp/bench/results.json --gpus 8 \
        2>&1 | tee "$OUT/simulate.log"
}

for what in "${@:-all}"; do
    case "$what" in
        tests) run_tests ;;
        learner) run_learner ;;
        generator) run_generator ;;
        weights) run_weights ;;
        lora) run_lora ;;
        async) run_async ;;
        all) run_tests; run_learner; run_generator; run_weights ;;
        *) echo "unknown step $what" >&2; exit 2 ;;
    esac
done
