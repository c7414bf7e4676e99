"""How many threads a role process runs: torch's, and the bursts of its side threads.

Two readers need the same answer: the controller, which pins roles to cores
(``controller.placement``) and hands each its share, and the generator and learner, which set
their own thread count when they start. The rule lives here, below both, so the workers do
not import the controller (docs/design.md §2). Stdlib and the config leaf only.

A role's side threads (the publisher's encoder, the generator's weight thread) fan a version's
independent pieces out over a ``burst_pool``: every core they may use, for the fraction of a
second a version takes, so that publish -> applied is as short as the cores allow rather than
one core's worth; the CPU spent is the same.

Those side threads also come first on a core (``favour_side_threads``): a role process's
compute threads (the learner's step, the generator's decode, a reward role's forward) run at
nice +``COMPUTE_NICE`` while its side threads keep the nice they started with. On a core both
want, the side thread's fraction of a second then goes first instead of being stretched over
the compute's time slices: the compute finishes when it would have anyway (the core does the
same work, only in another order), and the version reaches the generators sooner. Every role
does the same, so the roles' shares against one another are unchanged.

Example: 8 cores, 2 CPU learner ranks and 2 CPU generators, no ``threads`` set, not pinned:
``role_threads(config, "learner", None, 8) == 2``; pinned to cores [2, 3, 4]: 3. In
``run.mode=sync`` the same run gives each 4: generators and learners take turns there (a
generator waits for the version the learner is training), so each side may use every core
while the other waits, instead of leaving half of them idle.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

from streamrl.config import Config

# A burst's threads, at most: the work (comparing, scattering, hashing, repacking bf16
# images) is bound by memory bandwidth, which a few cores already fill.
BURST_THREADS_MAX = 8

# The nice value of a role's compute threads (module doc): CFS weighs a nice-0 thread about
# nine times one at nice 10, so a side thread's burst takes ~90% of a core it shares.
COMPUTE_NICE = 10

# libzmq's I/O threads carry every message, the weight chunks among them: side threads too.
MESSAGE_THREADS = "ZMQbg/"

_side_threads: set[int] = set()  # native ids of this process's side threads
_compute_nice: int | None = None  # what favour_side_threads set, once it has run


def role_threads(config: Config, role: str, cores: list[int] | None, available: int) -> int:
    """torch threads for one ``role`` process: its configured ``threads`` if set, else the
    cores it is pinned to, else an even share of ``available`` cores among the CPU processes
    that run at once (in sync mode, one side's: learners and generators alternate)."""
    section = getattr(config, role)
    if section.threads > 0:
        return section.threads
    if cores:
        return len(cores)
    counts = [s.count for s in (config.learner, config.generator) if s.device == "cpu"]
    concurrent = max(counts, default=1) if config.run.mode == "sync" else sum(counts)
    return max(1, available // max(concurrent, 1))


def burst_pool(cores: list[int] | None, name: str) -> ThreadPoolExecutor | None:
    """Threads for a burst of independent pieces of work (module doc): one per core of
    ``cores`` (default: the process's), each pinned to them; None on a single core, where the
    pieces stay on the calling thread."""
    usable = cores or sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        return None

    threads = min(len(usable), BURST_THREADS_MAX)
    started = threading.Barrier(threads + 1)

    def start() -> None:
        side_thread()
        try:
            if cores:
                os.sched_setaffinity(0, cores)  # this thread only (Linux affinity is per thread)
        finally:  # a core refused breaks the pool at its first use, not this wait
            started.wait(timeout=30)

    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name, initializer=start)
    # Every thread now, from the caller (a role's setup, at the nice it started with): an
    # executor starts its threads on demand, from whichever thread submits first, and one
    # started by a compute thread after ``favour_side_threads`` would inherit its nice.
    for _ in range(threads):
        pool.submit(lambda: None)
    started.wait(timeout=30)
    return pool


def side_thread() -> None:
    """Mark the calling thread as a side thread: ``favour_side_threads`` leaves its nice."""
    _side_threads.add(threading.get_native_id())


def favour_side_threads() -> int:
    """Lower every thread of this process except the side threads by ``COMPUTE_NICE`` (to 19
    at most) from the calling thread's nice (module doc); threads they start later inherit
    it. Called once by a role process's actor before its loop, never in a test's process.
    Returns how many threads it lowered: 0 where threads have no nice of their own (not
    Linux), on a second call, or where the process already runs at 19."""
    global _compute_nice
    if _compute_nice is not None:
        return 0
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return 0
    _compute_nice = min(19, os.getpriority(os.PRIO_PROCESS, 0) + COMPUTE_NICE)
    lowered = 0
    for tid in tids:
        if tid in _side_threads or _thread_name(tid).startswith(MESSAGE_THREADS):
            continue
        try:  # Linux: PRIO_PROCESS with a thread id sets that thread's nice alone
            if os.getpriority(os.PRIO_PROCESS, tid) < _compute_nice:
                os.setpriority(os.PRIO_PROCESS, tid, _compute_nice)
                lowered += 1
        except OSError:  # the thread ended meanwhile
            continue
    return lowered


def _thread_name(tid: int) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return ""
