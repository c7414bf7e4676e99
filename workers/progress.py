"""A role's progress: what its heartbeat proves beyond "the process is not stopped".

A heartbeat comes from a thread of its own (``generator_reports.HeartbeatThread``), so it goes
on while the role's main thread is wedged: in a forward that released the GIL, in a rule
reward that loops, on a weight hand-off that never comes. ``Progress`` is the main thread's
side: ``working()`` brackets what the role must finish (a generation call, a scoring batch,
a wait for a version the learner has published), ``tick()`` marks a step of it (a decode
step, a batch scored, a version adopted). The heartbeat carries ``stalled_s()``: how long the
role has had work and made no step; 0 while it has none (waiting for admission or requests is
not a stall). The supervisor replaces a role stalled for ``run.stall_timeout_s`` like a dead
one (``controller.roles.RoleSlot.failure``).

Example: a generation call starts at t=0 and its decode steps tick at 0.1 s, 0.2 s ...; at
t=4 a forward wedges. ``stalled_s`` reads 0 until then and ``now - 4`` after: at
``4 + run.stall_timeout_s`` the generator is replaced, its admitted groups returned.

Written by one thread, read by the heartbeat thread: plain attribute stores (atomic under
the GIL), read without a lock; a read between two stores is at worst one beat stale.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class Progress:
    """A step counter and the time the role's current work last moved."""

    def __init__(self) -> None:
        self.steps = 0
        self._depth = 0  # nested ``working`` blocks (a wait for weights inside a call)
        self._moved_at = time.monotonic()

    def tick(self) -> None:
        """One step of the work in hand was made."""
        self.steps += 1
        self._moved_at = time.monotonic()

    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        """The block is work the role must finish: its time without a ``tick`` is a stall."""
        if self._depth == 0:
            self._moved_at = time.monotonic()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            self.tick()

    def stalled_s(self, now: float | None = None) -> float:
        """Seconds the role has had work without a step; 0 when it has none."""
        if self._depth == 0:
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - self._moved_at)
