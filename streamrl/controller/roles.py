"""The roles a run started: one typed id and one slot per role, for all three kinds.

A role is a buffer shard, a learner rank or a generator, named by ``RoleId`` (never a string
parsed back). Its ``RoleSlot`` holds what the controller knows of its process: the Ray
actor, the ref of its running loop, its pid, the endpoints it bound and its incarnation.
Restarts, the last failure and the last time it was heard from live in ``RunState`` (the admin
API reads them from its own threads, under the state's lock), keyed by ``str(role_id)``.

``Roles`` is the registry: the controller and the supervisors (``supervisor.GeneratorPool``,
``recovery.Recovery``) put, replace and forget slots; ``pids.json`` is written from it.

Example::

    roles = Roles()
    roles.put(RoleId.learner(0), RoleSlot(actor, run_ref=actor.run.remote(10)))
    roles.role_of(run_ref)          # RoleId("learner rank", 0)
    str(RoleId.shard(3))            # "buffer shard 3"
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from streamrl.files import atomic_write_text

RoleKind = Literal["buffer shard", "learner rank", "generator"]


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


@dataclass
class RoleSlot:
    """One role's process as the controller knows it."""

    actor: Any
    run_ref: Any = None  # the ref of its running loop (``serve``/``run``); None before it
    pid_ref: Any = None  # the ref of its ``pid()`` call, until the pid is known
    pid: int | None = None  # -1: the actor died before telling it
    endpoints: tuple[str, ...] = ()
    incarnation: int = 0
    started_at: float = field(default_factory=time.time)


class Roles:
    def __init__(self) -> None:
        self.slots: dict[RoleId, RoleSlot] = {}
        self.all_pids: set[int] = set()  # every role process ever started (pids.json)
        self._pids_text = ""

    def put(self, role: RoleId, slot: RoleSlot) -> None:
        """Add ``role`` or replace its slot (a restart)."""
        self.slots[role] = slot

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
        """Learn the pids whose ``pid()`` answered (all of them, with ``wait``)."""
        import ray

        for slot in self.slots.values():
            if slot.pid is not None or slot.pid_ref is None:
                continue
            if wait or ray.wait([slot.pid_ref], timeout=0)[0]:
                try:
                    slot.pid = ray.get(slot.pid_ref)
                except ray.exceptions.RayError:  # died starting: its supervisor replaces it
                    slot.pid = -1

    def pids_by_role(self) -> dict[str, int]:
        return {
            str(role): slot.pid
            for role, slot in sorted(self.slots.items())
            if slot.pid is not None and slot.pid > 0
        }

    def write_pids(self, path: Path, controller_pid: int) -> None:
        """``pids.json``: every process this run started, by role (replacements included);
        rewritten only when it changed."""
        self.refresh_pids()
        by_role = self.pids_by_role()
        self.all_pids.update(by_role.values())
        text = json.dumps(
            {"controller": controller_pid, "roles": sorted(self.all_pids), "by_role": by_role}
        )
        if text != self._pids_text:
            self._pids_text = text
            atomic_write_text(path, text)

    def health(self, state: Any, now: float) -> dict[str, dict[str, Any]]:
        """Every role: alive, its newest heartbeat or report, restarts and last failure
        (``state``: the ``RunState``, read under its lock)."""
        import ray

        refs = self.run_refs("buffer shard", "learner rank")
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
        """Local mode: every role process this run started (by pid) is gone when ``launch``
        returns; an actor killed moments ago may still be exiting, so wait for it, then
        SIGKILL what is left."""
        deadline = time.monotonic() + timeout_s
        left = set(self.all_pids)
        while left:
            for pid in list(left):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    left.discard(pid)
                except PermissionError:  # the pid was reused by someone else's process
                    left.discard(pid)
            if not left:
                return
            if time.monotonic() > deadline:
                for pid in left:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.1)
