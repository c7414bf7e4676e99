"""A role's threads and their priorities (streamrl.cores)."""

from __future__ import annotations

import os

import pytest

_PRIORITIES = """
import json, os, threading
from streamrl.cores import COMPUTE_NICE, burst_pool, favour_side_threads, side_thread

pool = burst_pool(sorted(os.sched_getaffinity(0))[:2], "burst")
started, favoured, side_nice = threading.Event(), threading.Event(), []

def side():
    side_thread()
    started.set()
    favoured.wait(30)
    side_nice.append(os.getpriority(os.PRIO_PROCESS, 0))

side_worker = threading.Thread(target=side)
side_worker.start()
started.wait()
base = os.getpriority(os.PRIO_PROCESS, 0)
lowered = favour_side_threads()
favoured.set()
side_worker.join()
later = []
worker = threading.Thread(target=lambda: later.append(os.getpriority(os.PRIO_PROCESS, 0)))
worker.start(); worker.join()
# First used now, after favour_side_threads: threads it started now would be at the target.
both = threading.Barrier(2)  # each task waits for the other: one on each pool thread

def where():
    both.wait(30)
    return threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0)

# (no pool on one core: the work stays on the calling thread)
pool_seen = {f.result() for f in [pool.submit(where), pool.submit(where)]} if pool else set()
print(json.dumps({"base": base, "lowered": lowered, "again": favour_side_threads(),
                  "main": os.getpriority(os.PRIO_PROCESS, 0), "later": later[0],
                  "side": side_nice[0],
                  "pool": sorted({n for _, n in pool_seen}),
                  "threads": len({t for t, _ in pool_seen}),
                  "target": min(19, base + COMPUTE_NICE)}))
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
    assert seen["side"] == seen["base"]
    if len(os.sched_getaffinity(0)) >= 2:
        assert seen["threads"] == 2 and seen["pool"] == [seen["base"]]
