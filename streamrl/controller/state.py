"""The run's mutable state, one owner: ``RunState`` and its lock.

Written by the controller's report loop, the admission thread, the supervisor and the admin
API's threads; every write and every read that must be consistent holds ``state.lock``.

``PromptLedger`` is the prompt stream's bookkeeping: admission hands out the run's prompt
indices in order (``data.PromptStream``); each generator's outstanding indices are those
granted and not yet reported pushed; a generator that dies or retires gives its outstanding
indices back, and they are handed out again before any new one. Example: generator 1 is
granted [8, 9], reports 1 group pushed, dies: 9 returns, and the next grant to anyone starts
with 9.

It also keeps which prompts each learner step since the newest checkpoint trained on
(``BatchTaken``, sent by every rank as it takes its batch). Resuming from that checkpoint,
automatically or by ``--resume``, loses those steps, so their prompts go back to be handed
out first: the stream continues where the *checkpointed* model left off, with no prompt
skipped or trained twice.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamrl.controller.staleness import AdmissionPolicy
from streamrl.protocol import GeneratorReport, Heartbeat, ShardStats


class PromptLedger:
    def __init__(
        self,
        next_index: int = 0,
        retry: list[int] | None = None,
        trained: dict[int, list[int]] | None = None,
    ) -> None:
        self.next_index = next_index
        self.retry: deque[int] = deque(retry or [])
        self.outstanding: dict[int, deque[int]] = {}  # generator id -> granted, not pushed
        self.pushed: dict[int, int] = {}  # generator id -> groups pushed by this incarnation
        # Version -> prompt indices its step trained on, for steps after the newest checkpoint.
        self.trained: dict[int, list[int]] = dict(trained or {})

    def taken(self, version: int, indices: list[int]) -> None:
        """A learner rank took a batch for step ``version`` with these prompts (-1: none)."""
        self.trained.setdefault(version, []).extend(i for i in indices if i >= 0)

    def checkpointed(self, version: int) -> None:
        """The model at ``version`` is saved: earlier steps' prompts need no record."""
        self.trained = {v: ids for v, ids in self.trained.items() if v > version}

    def roll_back(self, version: int, extra: list[int] | None = None) -> list[int]:
        """The model is back at ``version``: the prompts of later steps (and ``extra``: those
        the shards' take receipts name) are handed out again, before any other, once each.
        Returns them."""
        reported = (i for v, ids in self.trained.items() if v > version for i in ids)
        lost = sorted({*reported, *(extra or [])})
        self.trained = {v: ids for v, ids in self.trained.items() if v <= version}
        self.retry = deque(sorted({*self.retry, *lost}))
        return lost

    def grant(self, generator_id: int, n: int) -> list[int]:
        indices = []
        for _ in range(n):
            if self.retry:
                indices.append(self.retry.popleft())
            else:
                indices.append(self.next_index)
                self.next_index += 1
        self.outstanding.setdefault(generator_id, deque()).extend(indices)
        return indices

    def delivered(self, generator_id: int, groups_pushed: int) -> None:
        """A report: this incarnation has pushed ``groups_pushed`` groups in all (in grant
        order), so that many of its oldest indices are delivered."""
        queue = self.outstanding.setdefault(generator_id, deque())
        for _ in range(max(0, groups_pushed - self.pushed.get(generator_id, 0))):
            if queue:
                queue.popleft()
        self.pushed[generator_id] = max(self.pushed.get(generator_id, 0), groups_pushed)

    def release(self, generator_id: int) -> int:
        """The generator is gone: its outstanding indices go back to be granted first.
        Returns how many (their admission budget returns too)."""
        queue = self.outstanding.pop(generator_id, deque())
        self.pushed.pop(generator_id, None)
        self.retry.extend(sorted(queue))
        return len(queue)

    def snapshot(self) -> dict[str, Any]:
        """What a resumed run continues from: never-granted and given-back indices alike."""
        pending = sorted({*self.retry, *(i for q in self.outstanding.values() for i in q)})
        return {"next_index": self.next_index, "retry": pending, "trained": self.trained}


@dataclass
class GeneratorHealth:
    incarnation: int = 0
    restarts: int = 0
    last_heartbeat: float | None = None
    last_failure: str = ""
    retiring: bool = False
    # The incarnation's delivery sender base (``buffers.delivery``): the shards' receipts of
    # its groups are under ``shard_sender(sender, shard_id)``.
    sender: str = ""


@dataclass
class RunState:
    """What the controller knows; updated from reports, read by admission and the admin API."""

    version: int = 0
    weights_epoch: int = 0  # learner-group restarts so far (AdmissionReply.weights_epoch)
    # The version each learner-group restart resumed at, in epoch order (``streamrl.clock``).
    forks: list[int] = field(default_factory=list)
    # Restarts of each buffer shard so far (AdmissionReply.shard_epochs): generators resend it
    # what it has not acknowledged.
    shard_epochs: dict[int, int] = field(default_factory=dict)
    stop: bool = False
    paused: bool = False
    generators: dict[int, GeneratorReport] = field(default_factory=dict)
    shards: dict[int, Any] = field(default_factory=dict)
    # Live generator knobs set through the admin API; None = the generators' own config.
    temperature: float | None = None
    prompts_per_call: int | None = None
    last_seen: dict[str, float] = field(default_factory=dict)  # role -> last report time
    # Held-out evaluation: the newest version asked for, and the newest answered (-1: none).
    eval_requested: int = -1
    eval_answered: int = -1
    prompts: PromptLedger = field(default_factory=PromptLedger)
    health: dict[int, GeneratorHealth] = field(default_factory=dict)  # by generator id
    # Role name -> restarts and last failure, for every supervised role (/status, metrics).
    restarts: dict[str, int] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    # The last reports of generator incarnations that ended: run totals keep their counts.
    ended: list[GeneratorReport] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    policy: AdmissionPolicy | None = None  # set by the controller (it reads current_version)

    def current_version(self) -> int:
        return self.version

    def buffer_dropped(self) -> int:
        """Groups every shard dropped so far, all reasons (their admission budget returns)."""
        return sum(shard_dropped(s) for s in self.shards.values())

    def all_generator_reports(self) -> list[GeneratorReport]:
        """Live generators' newest reports and the last of every ended incarnation (totals)."""
        return [*self.generators.values(), *self.ended]

    def generator_report(self, report: GeneratorReport) -> bool:
        """Take a generator's report; False (ignored) if it is from a replaced incarnation."""
        with self.lock:
            health = self.health.setdefault(report.generator_id, GeneratorHealth())
            if report.incarnation != health.incarnation:
                return False
            self.generators[report.generator_id] = report
            self.prompts.delivered(report.generator_id, report.groups_pushed)
            return True

    def heartbeat(self, beat: Heartbeat) -> None:
        """A generator's heartbeat; one from a replaced incarnation is ignored."""
        with self.lock:
            health = self.health.get(beat.index)
            if health is not None and health.incarnation == beat.incarnation:
                health.last_heartbeat = beat.time
                self.last_seen[f"generator {beat.index}"] = beat.time

    def count_restart(self, role: str, failure: str) -> int:
        """Note one more restart of ``role`` and why; returns its restarts so far."""
        with self.lock:
            self.restarts[role] = self.restarts.get(role, 0) + 1
            self.failures[role] = failure
            return self.restarts[role]

    def release_generator(self, generator_id: int) -> int:
        """A generator is gone: its admitted, undelivered groups return to the budget and
        their prompts to the ledger. Returns how many."""
        with self.lock:
            report = self.generators.pop(generator_id, None)
            if report is not None:
                self.ended.append(report)
            n = self.prompts.release(generator_id)
            if self.policy is not None:
                self.policy.give_back(n)
            return n


def load_prompt_ledger(run_dir: Path, version: int) -> PromptLedger:
    """The ledger a run resumed at checkpoint ``version`` continues from (written by the
    controller at every step, rolled back to ``version``); a run without one starts at 0."""
    path = run_dir / "prompts.json"
    if not path.is_file():
        return PromptLedger()
    saved = json.loads(path.read_text())
    trained = {int(v): [int(i) for i in ids] for v, ids in saved.get("trained", {}).items()}
    ledger = PromptLedger(int(saved["next_index"]), [int(i) for i in saved["retry"]], trained)
    ledger.roll_back(version)
    return ledger


def shard_dropped(stats: ShardStats) -> int:
    """Groups one shard dropped, all reasons. A durable shard counts from its log, over every
    process that served it: a restarted shard's own counters start again from 0."""
    if stats.received_total:
        return sum(n for why, n in stats.removed_total.items() if why != "consumed")
    return sum(stats.dropped.values())
