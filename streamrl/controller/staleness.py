"""Off-policy admission control (docs/design.md §3), AReaL-style, as one small pure class.

A generator may start a new prompt group only while

    groups_started - groups_dropped - groups_returned < (max_staleness + v + 1) * groups_per_step

where ``v`` is the learner's current version. Group number ``c`` (0-based, counted over every
generator) is budgeted for learner step ``c // groups_per_step``; to be consumed there with
staleness at most ``max_staleness`` it must start on weights of version
``>= c // groups_per_step - max_staleness``, which the reply tells the generator to wait for.
With ``max_staleness = 0`` this is synchronous RL: one batch per version, generated on it.

Example (groups_per_step=4, max_staleness=1, learner at v=0): 8 groups may start (two
batches); group 5 is budgeted for step 1 and needs weights >= 0; after the learner reaches
v=1, groups 8..11 open up and need weights >= 1.

No group is budgeted past the run's last step (``last_step``: ``run.max_steps``): the bound
is at most ``last_step * groups_per_step``, so the learner's last η steps no longer have
generators sample groups for steps that never come. Such groups were generated and never
trained: the default job's "in buffer" loss, 2-3% of its generation (η = 1, one step's groups
left at the end). A group dropped at the end still returns its budget and is replaced, so the
last step is filled as every other is; the budget is exact (a synchronous run relies on it).

``max_staleness`` is live (``controller.knobs``) and has one owner in the controller, the run's
config section ``buffer``: the policy reads it there at every decision and keeps no copy, so a
``PATCH /config`` that sets the config has set the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class VersionSource(Protocol):
    def current_version(self) -> int: ...


class StalenessBound(Protocol):
    """Where the bound lives: the run's ``BufferConfig`` (tests may pass any holder)."""

    max_staleness: int


@dataclass(frozen=True)
class Grant:
    granted: int
    min_version: int


class AdmissionPolicy:
    def __init__(
        self,
        groups_per_step: int,
        bound: StalenessBound,
        versions: VersionSource,
        last_step: int | None = None,
    ) -> None:
        self.groups_per_step = groups_per_step
        self.bound = bound
        self.versions = versions
        self.last_step = last_step  # None: no end (a simulation, a test)
        self.started = 0
        self.dropped = 0  # groups the buffer dropped (stale, overflow): their budget returns
        self.returned = 0  # groups admitted to a generator that died or left before pushing

    @property
    def max_staleness(self) -> int:
        return self.bound.max_staleness

    def capacity(self) -> int:
        v = self.versions.current_version()
        steps = self.max_staleness + v + 1
        if self.last_step is not None:
            steps = min(steps, self.last_step)
        return steps * self.groups_per_step

    def request(self, n_groups: int) -> Grant:
        room = self.capacity() - self.in_flight()
        granted = max(0, min(n_groups, room))
        if granted == 0:
            return Grant(0, 0)
        last = self.in_flight() + granted - 1
        self.started += granted
        return Grant(granted, max(0, last // self.groups_per_step - self.max_staleness))

    def in_flight(self) -> int:
        """Groups started that still count against the budget."""
        return self.started - self.dropped - self.returned

    def give_back(self, n_groups: int) -> None:
        """Groups admitted and never delivered (their generator died or retired)."""
        self.returned += n_groups

    def set_dropped(self, dropped: int) -> None:
        """Total groups dropped by the buffer so far (monotonic; reported by the shards)."""
        self.dropped = max(self.dropped, dropped)
