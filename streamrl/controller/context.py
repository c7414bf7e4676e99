"""What the controller shares with its collaborators, instead of itself.

The supervisors (``supervisor.GeneratorPool``, ``recovery.Recovery``), the admin view and the
controller's loop all work on one run: its config, state, admission policy, placement, role
registry, spec factory, run directory and metrics log. ``RunContext`` carries exactly those,
plus the few actions every supervisor needs (say something on the console, count a restart,
refresh the shards' figures, rewrite ``pids.json``). None of them receives the ``Controller``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from streamrl.config import Config
from streamrl.controller.placement import Placement
from streamrl.controller.roles import Roles
from streamrl.controller.rundir import RunError, save_clock
from streamrl.controller.specs import SpecFactory
from streamrl.controller.staleness import AdmissionPolicy
from streamrl.controller.state import RunState
from streamrl.metrics import MetricsLog
from streamrl.role_specs import NODE

log = logging.getLogger("streamrl")


@dataclass
class RunContext:
    config: Config
    state: RunState
    policy: AdmissionPolicy
    placement: Placement
    roles: Roles
    specs: SpecFactory
    run_dir: Path
    metrics: MetricsLog
    console: TextIO

    def __post_init__(self) -> None:
        # Local mode (loopback binds) runs every role on this host: their processes can be
        # told apart by start time and reaped here; a cluster's cannot.
        self.roles.local = self.specs.bind_host != NODE

    def note(self, message: str) -> None:
        """A supervision event, for the console and the controller's log."""
        log.warning("%s", message)
        print(message, file=self.console, flush=True)

    def count_restart(self, role: str, failure: str) -> int:
        """One more restart of ``role`` (why: ``failure``); its restarts so far. Raises a
        one-line RunError once they exceed ``run.max_restarts``."""
        restarts, limit = self.state.count_restart(role, failure), self.config.run.max_restarts
        if restarts > limit:
            raise RunError(
                f"{role} failed {restarts} times (run.max_restarts={limit}); last: {failure} "
                f"(see {self.run_dir / 'logs'})"
            )
        return restarts

    def refresh_shard_stats(self, reply_timeout_s: float = 30.0) -> None:
        """Ask every shard for its figures now (its periodic report may be a second old); a
        shard that does not answer within ``reply_timeout_s`` keeps its last figures."""
        from streamrl.buffers.client import BufferClient

        endpoints = [req for _, req in self.specs.shard_endpoints]
        client = BufferClient(endpoints, name="controller", reply_timeout_s=reply_timeout_s)
        try:
            for stats in client.stats():
                if stats is not None:
                    with self.state.lock:
                        self.state.shards[stats.shard_id] = stats
        finally:
            client.close()

    def start_epoch(self, epoch: int, forks: list[int]) -> None:
        """A learner epoch begins (``streamrl.clock``): ``clock.json`` first, before any group
        of it trains (a later ``--resume`` starts above it), then an ``epoch`` event in
        ``metrics.jsonl`` (``clock.live_records`` reads the timeline from those)."""
        save_clock(self.run_dir, epoch, forks)
        self.metrics.event("epoch", epoch=epoch, forks=forks)

    def write_pids(self) -> None:
        self.roles.write_pids(self.run_dir / "pids.json", os.getpid())
