# H200 machine, 2026-11-26 (third session), commit 352fc0a: call 1 wheels + GPU tests, call 2 GGUF
# parts, call 3 this. Its first part (setup, GGUF assembly, core pairs) is device_job.sh's up to
# `set -- $PAIRS`; what follows replaced that file's launch part: four seeds of the default job, no
# AMX-off run. Run as: RUN_LIMIT=530 PREFIX=amx07 bash THIS
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
