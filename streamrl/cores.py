"""How many torch threads a role process runs.

Two readers need the same answer: the controller, which pins roles to cores
(``controller.placement``) and hands each its share, and the generator and learner, which set
their own thread count when they start. The rule lives here, below both, so the workers do
not import the controller (docs/design.md §2). Stdlib and the config leaf only.

Example: 8 cores, 2 CPU learner ranks and 2 CPU generators, no ``threads`` set, not pinned:
``role_threads(config, "learner", None, 8) == 2``; pinned to cores [2, 3, 4]: 3. In
``run.mode=sync`` the same run gives each 4: generators and learners take turns there (a
generator waits for the version the learner is training), so each side may use every core
while the other waits, instead of leaving half of them idle.
"""

from __future__ import annotations

from streamrl.config import Config


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
