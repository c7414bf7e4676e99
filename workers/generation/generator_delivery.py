"""The generator's delivery: sampled groups to the buffer shards, after their served scores.

``Delivery`` is one part with one interface whatever the run's rewards: the shards' pushers
(``generator_sockets.ShardPushers``: acknowledged delivery, each group named by its grant)
and a scoring part. With served rewards (docs/design.md §7c) that is ``scoring.GroupScoring``:
a group waits there for its reward roles' scores while the engine samples on, and ``pump``
pushes it once they are in (or refused). A run whose rewards are all rules holds
``NoScoring``: nothing waits, every group is pushed as it is delivered, and an evaluation's
report goes at once. So the generator never asks which it has.

Invariant: each granted group is pushed exactly once, in whatever order its scores settle;
``pending`` counts what still waits for scores (0 with ``NoScoring``).

Example: deliver([g0, g1], first=4) over 2 shards names g0 shard 0 seq 2, g1 shard 1 seq 2;
with ``NoScoring`` both are pushed now, with ``GroupScoring`` each when ``pump`` finds its
scores in.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import zmq

from streamrl.protocol import Receipts, ScoringFigures, TrajectoryGroup
from streamrl.workers.generation.generator_sockets import Admission, ShardPushers
from streamrl.workers.generation.scoring import GroupScoring, Served

if TYPE_CHECKING:
    from streamrl.role_specs import GeneratorSpec
    from streamrl.workers.generation.sampling import Sampler


class Scoring(Protocol):
    """What delivery needs of served scoring: ``GroupScoring``, or ``NoScoring``."""

    @property
    def pending(self) -> int: ...

    def submit(self, groups: list[TrajectoryGroup]) -> list[TrajectoryGroup]: ...

    def pump(self, wait_ms: int = 0) -> list[TrajectoryGroup]: ...

    def take_epochs(
        self, scorer_epochs: dict[int, int], scorer_endpoints: dict[int, str] | None = None
    ) -> None: ...

    def score_responses(
        self,
        samples: list[dict[str, Any]],
        questions: Callable[[], dict[str, str]],
        done: Callable[[Served], None],
    ) -> None: ...

    def finish_evals(self) -> None: ...

    def snapshot(self) -> ScoringFigures: ...

    def close(self) -> None: ...


class NoScoring:
    """The scoring part of a run whose rewards are all rules: nothing waits for a score."""

    pending = 0

    def submit(self, groups: list[TrajectoryGroup]) -> list[TrajectoryGroup]:
        return groups  # every group is pushed at once

    def pump(self, wait_ms: int = 0) -> list[TrajectoryGroup]:
        return []

    def take_epochs(
        self, scorer_epochs: dict[int, int], scorer_endpoints: dict[int, str] | None = None
    ) -> None:
        pass

    def score_responses(
        self,
        samples: list[dict[str, Any]],
        questions: Callable[[], dict[str, str]],
        done: Callable[[Served], None],
    ) -> None:
        done({})  # no served reward: the evaluation's report goes as it is

    def finish_evals(self) -> None:
        pass

    def snapshot(self) -> ScoringFigures:
        return ScoringFigures()

    def close(self) -> None:
        pass


class Delivery:
    """The shards' pushers and the scoring part between the sampler and them (module doc).
    Owned by the generator's one thread: every method runs there."""

    def __init__(self, pushers: ShardPushers, scoring: Scoring) -> None:
        self.pushers, self.scoring = pushers, scoring

    @classmethod
    def connect(
        cls, ctx: zmq.Context, spec: GeneratorSpec, sender: str, sampler: Sampler
    ) -> Delivery:
        """A pusher per shard, and ``GroupScoring`` when the run serves rewards."""
        pushers = ShardPushers.connect(ctx, spec.shard_endpoints, sender, spec.generator_id)
        scoring: Scoring = NoScoring()
        if spec.reward_endpoints:
            endpoints = dict(spec.reward_endpoints)
            settle = sampler.settle  # normalised, weighted, summed once all are in
            scoring = GroupScoring(ctx, spec.config, endpoints, sender, sampler.question, settle)
        return cls(pushers, scoring)

    @property
    def groups_pushed(self) -> int:
        return self.pushers.groups_pushed

    @property
    def pending(self) -> int:
        """Groups and evaluations waiting for served scores."""
        return self.scoring.pending

    def take_grant(self, n: int) -> int:
        """A grant of ``n`` groups came: the position of its first (``ShardPushers``)."""
        return self.pushers.take_grant(n)

    def deliver(self, groups: list[TrajectoryGroup], first: int) -> None:
        """A grant's groups, sampled (in grant order, the first at position ``first``): named
        by grant, then pushed, or left to wait for their served scores."""
        self.pushers.address(groups, first)  # by grant: pushed in whatever order they settle
        self.pushers.push(self.scoring.submit(groups))
        self.pump()

    def pump(self, wait_ms: int = 0) -> None:
        """Push the groups whose served scores are all in (``workers.generation.scoring``)."""
        scored = self.scoring.pump(wait_ms)
        if scored:
            self.pushers.push(scored)

    def wait(self, wait_ms: int) -> None:
        """Nothing granted: wait ``wait_ms`` for served scores if some are pending, else
        sleep."""
        if self.scoring.pending:
            self.pump(wait_ms)
        else:
            time.sleep(wait_ms / 1000)

    def take_receipts(self, receipts: Receipts) -> None:
        """An admission reply's receipts: the shards' (``ShardPushers.take_receipts``), the
        reward roles' restarts (``GroupScoring.take_epochs``); then push what settled."""
        self.pushers.take_receipts(receipts)
        self.scoring.take_epochs(receipts.scorer_epochs, receipts.scorer_endpoints)
        self.pump()

    def take_shard_receipts(self, receipts: Receipts) -> None:
        """The shards' receipts only (a reply asked while waiting for weights: the loop's
        next reply brings the reward roles' restarts)."""
        self.pushers.take_receipts(receipts)

    def score_responses(
        self,
        samples: list[dict[str, Any]],
        questions: Callable[[], dict[str, str]],
        done: Callable[[Served], None],
    ) -> None:
        """An evaluation's responses to the served rewards; ``done`` gets their scores from a
        later ``pump`` (at once with ``NoScoring``, or with no response)."""
        self.scoring.score_responses(samples, questions, done)

    def drain(self, stop_at: float) -> None:
        """Leaving: push what waits for scores as they come in until ``stop_at`` (refused
        after that by ``scoring.timeout_s``), and hand waiting evaluations what came in."""
        while self.scoring.pending and time.monotonic() < stop_at:
            self.pump(wait_ms=50)
        self.pump()
        self.scoring.finish_evals()  # an evaluation's report goes with what came in

    def await_receipts(self, admission: Admission) -> int:
        """Before leaving: the shards' receipts of every group pushed
        (``ShardPushers.await_receipts``)."""
        return self.pushers.await_receipts(admission)

    def snapshot(self) -> ScoringFigures:
        """The served scoring's figures for the generator's report."""
        return self.scoring.snapshot()

    def close(self) -> None:
        self.scoring.close()
