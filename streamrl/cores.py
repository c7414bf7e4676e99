"""How many threads a role process runs: torch's, and the bursts of its side threads.

Two readers need the same answer: the controller, which pins roles to cores
(``controller.placement``) and hands each its share, and the generator and learner, which set
their own thread count when they start. The rule lives here, below both, so the workers do
not import the controller (docs/design.md §2). Stdlib and the config leaf only.

A role's side threads (the publisher's encoder, the generator's weight thread) fan a version's
independent pieces out over a ``burst_pool``: every core they may use, for the fraction of a
second a version takes, so that publish -> applied is as short as the cores allow rather than
one core's worth; the CPU spent is the same.

Example: 8 cores, 2 CPU learner ranks and 2 CPU generators, no ``threads`` set, not pinned:
``role_threads(config, "learner", None, 8) == 2``; pinned to cores [2, 3, 4]: 3. In
``run.mode=sync`` the same run gives each 4: generators and learners take turns there (a
generator waits for the version the learner is training), so each side may use every core
while the other waits, instead of leaving half of them idle.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from streamrl.config import Config

# A burst's threads, at most: the work (comparing, scattering, hashing, repacking bf16
# images) is bound by memory bandwidth, which a few cores already fill.
BURST_THREADS_MAX = 8


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

    def pin() -> None:
        if cores:
            os.sched_setaffinity(0, cores)  # this thread only (Linux affinity is per thread)

    threads = min(len(usable), BURST_THREADS_MAX)
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name, initializer=pin)
