"""A role's threads and their priorities (streamrl.cores)."""

from __future__ import annotations

import os

import pytest

_PRIORITIES = """
import json, os, threading, time
from streamrl.cores import COMPUTE_NICE, burst_pool, favour_side_threads, side_thread

pool = burst_pool(sorted(os.sched_getaffinity(0))[:2], "burst")
pool_tids = sorted(pool.submit(threading.get_native_id).result() for _ in range(50))
started = threading.Event()

def side():
    side_thread()
    started.set()
    time.sleep(5)

threading.Thread(target=side, daemon=True).start()
started.wait()
base = os.getpriority(os.PRIO_PROCESS, 0)
lowered = favour_side_threads()
later = []
worker = threading.Thread(target=lambda: later.append(os.getpriority(os.PRIO_PROCESS, 0)))
worker.start(); worker.join()
nice = {int(t): os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}
print(json.dumps({"base": base, "lowered": lowered, "again": favour_side_threads(),
                  "main": os.getpriority(os.PRIO_PROCESS, 0), "later": later[0],
                  "pool": sorted({nice[t] for t in set(pool_tids)}),
                  "threads": len(set(pool_tids)), "target": min(19, base + COMPUTE_NICE)}))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="per-thread nice is Linux's")
def test_a_role_s_compute_threads_yield_to_its_side_threads() -> None:
    """favour_side_threads (streamrl.cores): the compute threads go COMPUTE_NICE lower, the
    threads they start later with them; side threads and a burst pool's threads (started when
    the pool is made, not when first used) keep their nice. In a child process: a test must
    not lower pytest's own threads."""
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _PRIORITIES], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    if seen["base"] >= 19:
        pytest.skip("this process already runs at nice 19")
    assert seen["lowered"] >= 1 and seen["again"] == 0  # once per process
    assert seen["main"] == seen["later"] == seen["target"]
    if len(os.sched_getaffinity(0)) >= 2:
        assert seen["threads"] == 2 and seen["pool"] == [seen["base"]]
