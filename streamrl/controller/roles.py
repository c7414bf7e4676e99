"""The roles a run started: one typed id and one slot per role, for all three kinds.

A role is a buffer shard, a learner rank or a generator, named by ``RoleId`` (never a string
parsed back). Its ``RoleSlot`` holds what the controller knows of its process: the Ray
actor, the ref of its running loop, its pid, the endpoints it bound and its incarnation.
Restarts, the last failure and the last time it was heard from live in ``RunState`` (the admin
API reads them from its own threads, under the state's lock), keyed by ``str(role_id)``.

``Roles`` is the registry: the controller and the supervisors (``supervisor.GeneratorPool``,
``recovery.Recovery``) put, replace and forget slots; ``pids.json`` is written from it.

In local mode a role's process is known by its identity, pid plus start time
(``processes.ProcessIdentity``), read when its pid is learned. Teardown (``reap``) signals only a
process whose start time still matches: the pid of a role replaced hours ago may belong to
someone else's process by then. A replaced or retired role's process is forgotten once it is
seen gone. On a cluster the pids are other hosts': they are listed bare and never signalled.

Example::

    roles = Roles()
    roles.put(RoleId.learner(0), RoleSlot(actor, run_ref=actor.run.remote(10)))
    roles.role_of(run_ref)          # RoleId("learner rank", 0)
    str(RoleId.shard(3))            # "buffer shard 3"
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from streamrl.config import RunConfig
from streamrl.controller.processes import ProcessIdentity
from streamrl.files import atomic_write_text

FIRST_BEAT_GRACE_S = 60.0  # a fresh actor process imports torch before its first heartbeat

RoleKind = Literal["buffer shard", "learner rank", "generator", "reward role"]


@dataclass(frozen=True, order=True)
class RoleId:
    kind: RoleKind
    index: int

    def __str__(self) -> str:
        return f"{self.kind} {self.index}"

    @classmethod
    def shard(cls, shard_id: int) -> RoleId:
        return cls("buffer shard", shard_id)

    @classmethod
    def learner(cls, rank: int) -> RoleId:
        return cls("learner rank", rank)

    @classmethod
    def generator(cls, generator_id: int) -> RoleId:
        return cls("generator", generator_id)

    @classmethod
    def reward(cls, index: int) -> RoleId:
        """The reward role serving ``rewards[index]``."""
        return cls("reward role", index)


@dataclass
class RoleSlot:
    """One role's process as the controller knows it."""

    actor: Any
    run_ref: Any = None  # the ref of its running loop (``serve``/``run``); None before it
    pid_ref: Any = None  # the ref of its ``pid()`` call, until the pid is known
    pid: int | None = None  # -1: the actor died before telling it
    process: ProcessIdentity | None = None  # None: unknown, or gone when the pid was learned
    endpoints: tuple[str, ...] = ()
    incarnation: int = 0
    started_at: float = field(default_factory=time.time)

    def silent_for(self, heard: float | None, now: float, listening_since: float = 0.0) -> float:
        """Seconds since its newest heartbeat (``heard``), or, before its first, since its
        start less ``FIRST_BEAT_GRACE_S``, and at most since ``listening_since`` (the end of
        a restart that held the controller, ``Roles.listening_since``): what supervision
        compares with ``run.heartbeat_timeout_s``."""
        return now - max(heard or self.started_at + FIRST_BEAT_GRACE_S, listening_since)

    def unresponsive(
        self,
        heard: float | None,
        stalled_s: float,
        now: float,
        run: RunConfig,
        listening_since: float = 0.0,
    ) -> str | None:
        """Why this live process is to be replaced like a dead one, or None: silent (no
        heartbeat for ``run.heartbeat_timeout_s``: killed, SIGSTOPped) or stalled (its
        heartbeats say its work has not moved for ``run.stall_timeout_s``: a wedged
        forward, a hung reward; ``workers.progress``). The one liveness rule of every
        supervised role."""
        silent_for = self.silent_for(heard, now, listening_since)
        if silent_for > run.heartbeat_timeout_s:
            return f"no heartbeat for {silent_for:.0f} s"
        if run.stall_timeout_s > 0 and stalled_s > run.stall_timeout_s:
            return f"no progress for {stalled_s:.0f} s with work in hand"
        return None


class Roles:
    def __init__(self, local: bool = True) -> None:
        self.local = local  # every role runs on this host (``RunContext`` sets it)
        self.slots: dict[RoleId, RoleSlot] = {}
        # Every role process started and not yet seen gone, replaced ones included (pids.json).
        self.processes: set[ProcessIdentity] = set()
        self.all_pids: set[int] = set()  # every role pid ever learned (tests read it)
        # When a restart last released the controller's loop. While it held the loop the
        # heartbeats were not read, and the restarted processes loading on the same cores
        # can starve the others' heartbeat threads (a generator's beats arrived 2-3 s late
        # and 2 s apart after a learner restart on a loaded 2-core host): silence is counted
        # from here, not from before the restart.
        self.listening_since = 0.0
        self._pids_text = ""

    def put(self, role: RoleId, slot: RoleSlot) -> None:
        """Add ``role`` or replace its slot (a restart)."""
        self.slots[role] = slot
        if slot.process is not None:
            self.processes.add(slot.process)

    def forget(self, role: RoleId) -> RoleSlot | None:
        return self.slots.pop(role, None)

    def of_kind(self, kind: RoleKind) -> dict[int, RoleSlot]:
        """The slots of one kind, by index, lowest first."""
        return {r.index: s for r, s in sorted(self.slots.items()) if r.kind == kind}

    def actors(self, kind: RoleKind) -> list[Any]:
        return [slot.actor for slot in self.of_kind(kind).values()]

    def role_of(self, ref: Any) -> RoleId | None:
        """The role whose running loop ``ref`` is (None: a replaced one's, or unknown)."""
        for role, slot in self.slots.items():
            if slot.run_ref is not None and slot.run_ref == ref:
                return role
        return None

    def run_refs(self, *kinds: RoleKind) -> list[Any]:
        return [
            s.run_ref
            for r, s in sorted(self.slots.items())
            if r.kind in kinds and s.run_ref is not None
        ]

    def refresh_pids(self, wait: bool = False) -> None:
        """Learn the pids whose ``pid()`` answered (all of them, with ``wait``), each with its
        process's start time, and remember those processes."""
        pending = [s for s in self.slots.values() if s.pid is None and s.pid_ref is not None]
        if pending:
            import ray

            for slot in pending:
                if not (wait or ray.wait([slot.pid_ref], timeout=0)[0]):
                    continue
                try:
                    slot.pid = ray.get(slot.pid_ref)
                except ray.exceptions.RayError:  # died starting: its supervisor replaces it
                    slot.pid = -1
                    continue
                if self.local:
                    # Read as soon as the pid is known: gone already means no identity, never
                    # signalled (its pid may be anyone's by now).
                    slot.process = ProcessIdentity.of(slot.pid)
                    if slot.process is not None:
                        self.processes.add(slot.process)
        self.all_pids.update(self.pids_by_role().values())

    def forget_ended(self) -> None:
        """Drop the processes that are gone (a replaced or retired role's, a dead one's)."""
        self.processes = {p for p in self.processes if p.running()}

    def pids_by_role(self) -> dict[str, int]:
        return {
            str(role): slot.pid
            for role, slot in sorted(self.slots.items())
            if slot.pid is not None and slot.pid > 0
        }

    def write_pids(self, path: Path, controller_pid: int) -> None:
        """``pids.json``: every process of this run that may still exist, by role (replaced
        ones until they are gone), with its start time (``/proc/<pid>/stat`` field 22) so a
        reader can tell it from a later process with the same pid; rewritten only when it
        changed. On a cluster: every role pid ever learned, bare."""
        self.refresh_pids()
        self.forget_ended()
        pids = [p.pid for p in self.processes] if self.local else self.all_pids
        text = json.dumps(
            {
                "controller": controller_pid,
                "roles": sorted(pids),
                "by_role": self.pids_by_role(),
                "start_ticks": {str(p.pid): p.start_ticks for p in sorted(self.processes)},
            }
        )
        if text != self._pids_text:
            self._pids_text = text
            atomic_write_text(path, text)

    def unresponsive(self, role: RoleId, state: Any, now: float, run: RunConfig) -> str | None:
        """Why ``role``'s live process is to be replaced (``RoleSlot.unresponsive``), from its
        newest heartbeat in ``state`` (the ``RunState``), its silence counted from
        ``listening_since`` at the earliest."""
        name = str(role)
        heard, stalled = state.last_seen.get(name), state.stalled.get(name, 0.0)
        return self.slots[role].unresponsive(heard, stalled, now, run, self.listening_since)

    def health(self, state: Any, now: float) -> dict[str, dict[str, Any]]:
        """Every role: alive, its newest heartbeat or report, restarts and last failure
        (``state``: the ``RunState``, read under its lock)."""
        import ray

        refs = self.run_refs("buffer shard", "learner rank", "reward role")
        running: set[RoleId | None] = set()
        if refs:
            _, not_done = ray.wait(refs, timeout=0, num_returns=len(refs))
            running = {self.role_of(ref) for ref in not_done}
        with state.lock:
            return {
                str(role): {
                    "alive": role in running or role.kind == "generator",
                    "last_heartbeat": state.last_seen.get(str(role)),
                    "restarts": state.restarts.get(str(role), 0),
                    "last_failure": state.failures.get(str(role), ""),
                }
                for role in sorted(self.slots)
            }

    def kill(self, role: RoleId) -> None:
        import ray

        slot = self.slots.get(role)
        if slot is None:
            return
        try:
            ray.kill(slot.actor, no_restart=True)
        except Exception:  # already gone
            pass

    def kill_all(self) -> None:
        for role in list(self.slots):
            self.kill(role)

    def reap(self, timeout_s: float = 10.0) -> None:
        """Local mode: every role process this run started is gone when ``launch`` returns;
        an actor killed moments ago may still be exiting, so wait for it, then SIGKILL what is
        left. Only the processes themselves: a pid now held by a process that started at
        another time is someone else's, and is left alone. On a cluster there is nothing
        here to reap: Ray ends the actors on each node."""
        deadline = time.monotonic() + timeout_s
        left = set(self.processes)
        while left:
            left = {p for p in left if p.running()}
            if not left:
                return
            if time.monotonic() > deadline:
                for process in left:
                    process.send(signal.SIGKILL)
                return
            time.sleep(0.1)
