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
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from streamrl.buffers.delivery import shard_sender
from streamrl.clock import LearnerClock
from streamrl.controller.staleness import AdmissionPolicy
from streamrl.protocol import (
    BatchTaken,
    EvalReport,
    GeneratorReport,
    Heartbeat,
    LearnerStep,
    ShardReport,
    ShardStats,
    TakeReceipt,
)

log = logging.getLogger("streamrl")


# Indices kept per generator of those reported pushed: enough for the groups in flight.
MAX_REPORTED = 4096


class PromptLedger:
    def __init__(
        self,
        next_index: int = 0,
        retry: list[int] | None = None,
        trained: dict[int, list[int]] | None = None,
    ) -> None:
        self.next_index = next_index
        self.retry: deque[int] = deque(retry or [])
        # Generator id -> (grant position, index) granted to this incarnation, not yet
        # reported pushed. The grant position k is the grant's place in the incarnation's
        # grant order, and its delivery identity: grant k goes to shard k % S as that shard's
        # seq k // S (``ShardPushers.address``), whatever order groups are pushed in (served
        # scoring settles them as their scores come), so the shards' delivery floors and the
        # seqs they have above them say exactly which grants arrived (``release``).
        self.outstanding: dict[int, deque[tuple[int, int]]] = {}
        self.granted: dict[int, int] = {}  # generator id -> grants to this incarnation
        self.pushed: dict[int, int] = {}  # generator id -> groups pushed by this incarnation
        # Generator id -> its newest (push position, index) reported pushed (``release``).
        self.reported: dict[int, deque[tuple[int, int]]] = {}
        # Version -> prompt indices its step trained on, for steps after the newest checkpoint.
        self.trained: dict[int, list[int]] = dict(trained or {})

    def taken(self, version: int, indices: list[int]) -> None:
        """A learner rank took a batch for step ``version`` with these prompts (-1: none)."""
        self.trained.setdefault(version, []).extend(i for i in indices if i >= 0)

    def checkpointed(self, version: int) -> None:
        """No resume can go back before ``version`` (the model at it is saved, or, before any
        checkpoint, a resume starts the stream over): earlier steps' prompts need no record."""
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

    def grant(
        self, generator_id: int, n: int, keep: Callable[[int], bool] | None = None
    ) -> list[int]:
        """``n`` indices for the generator: those owed first (``retry``), then fresh ones;
        ``keep`` (the difficulty sampler's) may pass a fresh index over, never an owed one."""
        indices = []
        for _ in range(n):
            if self.retry:
                indices.append(self.retry.popleft())
            else:
                indices.extend(self.draw(1, keep))
        first = self.granted.get(generator_id, 0)
        self.granted[generator_id] = first + n
        queue = self.outstanding.setdefault(generator_id, deque())
        queue.extend(enumerate(indices, start=first))
        return indices

    def draw(self, n: int, keep: Callable[[int], bool] | None = None) -> list[int]:
        """``n`` fresh indices that no grant owes: probe sampling's candidates
        (``Grant.candidates``). The stream moves past them; one the generator does not choose
        is passed over, as the difficulty sampler passes over (``keep``, which applies here
        too)."""
        indices = []
        for _ in range(n):
            while keep is not None and not keep(self.next_index):
                self.next_index += 1
            indices.append(self.next_index)
            self.next_index += 1
        return indices

    def delivered(self, generator_id: int, groups_pushed: int) -> None:
        """A report: this incarnation has pushed ``groups_pushed`` groups in all (in grant
        order), so that many of its oldest indices are delivered."""
        queue = self.outstanding.setdefault(generator_id, deque())
        reported = self.reported.setdefault(generator_id, deque(maxlen=MAX_REPORTED))
        # Bounded by what is owed: a malformed report's count (2**62) must not spin here.
        newly = max(0, groups_pushed - self.pushed.get(generator_id, 0))
        for _ in range(min(newly, len(queue))):
            reported.append(queue.popleft())
        self.pushed[generator_id] = max(self.pushed.get(generator_id, 0), groups_pushed)

    def release(
        self,
        generator_id: int,
        floors: dict[int, int] | None = None,
        above: dict[int, set[int]] | None = None,
    ) -> int:
        """The generator is gone: its undelivered indices go back to be granted first.
        Returns how many (their admission budget returns too).

        ``floors``: per shard id (every shard of the run), the highest seq up to which that
        shard acknowledges this incarnation's groups (-1: none; ``buffers.delivery``), when
        known. They override the reports, which a generator killed between pushing and
        reporting never sent (its pushed groups would be generated twice), and which count a
        group pushed into a socket that died with the process as delivered (one missing group
        would hang a synchronous run). A grant arrived iff its push (shard, seq) is at or
        under that shard's floor, or among the seqs it has above it (``above``, per shard id:
        a group pushed before an earlier grant's, whose scores came later); a sum of floors
        would not do, since what arrived is not a prefix of the grant order."""
        queue = self.outstanding.pop(generator_id, deque())
        reported = self.reported.pop(generator_id, deque())
        self.pushed.pop(generator_id, 0)
        self.granted.pop(generator_id, 0)
        if floors is None:
            back = [index for _, index in queue]
        else:
            shards, above = max(1, len(floors)), above or {}
            back = [
                index
                for k, index in (*reported, *queue)
                if k // shards > floors.get(k % shards, -1)
                and k // shards not in above.get(k % shards, ())
            ]
        self.retry.extend(sorted(back))
        return len(back)

    def snapshot(self) -> dict[str, Any]:
        """What a resumed run continues from: never-granted and given-back indices alike."""
        outstanding = (i for q in self.outstanding.values() for _, i in q)
        pending = sorted({*self.retry, *outstanding})
        return {"next_index": self.next_index, "retry": pending, "trained": self.trained}


@dataclass
class GeneratorHealth:
    """A generator slot's lifecycle. Its restarts, last failure and last heartbeat are kept
    with every other role's, by role name (``RunState.restarts``, ``failures``, ``last_seen``)."""

    incarnation: int = 0
    retiring: bool = False
    # Released (retired, replaced or forgotten): its totals are in ``RunState.ended``, where a
    # report still in flight from it goes too (not back among the live ones).
    released: bool = False
    # The incarnation's delivery sender base (``buffers.delivery``): the shards' receipts of
    # its groups are under ``shard_sender(sender, shard_id)``.
    sender: str = ""


@dataclass
class RunState:
    """What the controller knows; updated from reports, read by admission and the admin API."""

    version: int = 0
    checkpointed: int = -1  # the learners' newest checkpoint (-1: none yet)
    weights_epoch: int = 0  # learner-group restarts so far (AdmissionReply.clock.weights_epoch)
    # The version each learner-group restart resumed at, in epoch order (``streamrl.clock``).
    forks: list[int] = field(default_factory=list)
    # Restarts of each buffer shard so far (AdmissionReply.receipts.shard_epochs): generators
    # resend it what it has not acknowledged.
    shard_epochs: dict[int, int] = field(default_factory=dict)
    # Restarts of each reward role so far, by its reward's index (``Receipts.scorer_epochs``):
    # generators send it what was in flight again.
    scorer_epochs: dict[int, int] = field(default_factory=dict)
    # Where each reward role's current incarnation listens (``Receipts.scorer_endpoints``):
    # a restarted role may bind elsewhere (another node, or its old port still held).
    scorer_endpoints: dict[int, str] = field(default_factory=dict)
    # Each reward role's newest report (its current incarnation's), by its reward's index.
    reward_roles: dict[int, Any] = field(default_factory=dict)
    # The run's one stop flag (``Controller.request_stop``, or the learners finished): admission
    # closes, generators drain, and a role failing now ends the run instead of restarting.
    stop: bool = False
    paused: bool = False
    generators: dict[int, GeneratorReport] = field(default_factory=dict)
    shards: dict[int, Any] = field(default_factory=dict)
    # Live generator knobs set through the admin API; None = the generators' own config.
    temperature: float | None = None
    prompts_per_call: int | None = None
    last_seen: dict[str, float] = field(default_factory=dict)  # role -> last report time
    # role -> seconds its newest heartbeat says its work has not moved (``workers.progress``)
    stalled: dict[str, float] = field(default_factory=dict)
    # Held-out evaluation: the newest version asked for, and the newest answered (-1: none);
    # ``eval_due`` every version asked for and not answered yet, in order.
    eval_requested: int = -1
    eval_answered: int = -1
    eval_due: list[int] = field(default_factory=list)
    prompts: PromptLedger = field(default_factory=PromptLedger)
    health: dict[int, GeneratorHealth] = field(default_factory=dict)  # by generator id
    # Role name -> restarts and last failure, for every supervised role (/status, metrics).
    restarts: dict[str, int] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    # The last reports of generator incarnations that ended: run totals keep their counts.
    ended: list[GeneratorReport] = field(default_factory=list)
    # data.sampler: difficulty (controller.difficulty); None: uniform.
    difficulty: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    policy: AdmissionPolicy | None = None  # set by the controller (it reads current_version)

    # Groups consumed by learner steps that a restart took back (returned to the budget).
    rolled_back: int = 0

    def current_version(self) -> int:
        return self.version

    # ------------------------------------------------------------------ reports

    def learner_stepped(self, step: LearnerStep, eval_every: int, max_steps: int) -> None:
        """The current learner group finished step ``step.version``: the version moves, a
        checkpoint step prunes the prompt record, and every ``eval_every`` versions (the last
        is evaluated as generators drain) an evaluation is asked for."""
        with self.lock:
            self.version = step.version
            saved = "checkpoint/version" in step.metrics
            if saved:
                self.checkpointed = step.version
            # Before the first checkpoint no resume comes back to a step (it starts over), so
            # the steps reported so far need no record either: the ledger stays small.
            if saved or self.checkpointed < 0:
                self.prompts.checkpointed(step.version)
            if eval_every > 0 and step.version % eval_every == 0 and step.version < max_steps:
                self.ask_eval(step.version)
            self.last_seen["learner rank 0"] = step.time

    def batch_taken(self, taken: BatchTaken) -> None:
        with self.lock:
            self.prompts.taken(taken.version, taken.prompt_indices)

    def shard_report(self, report: ShardReport) -> None:
        stats = report.stats
        with self.lock:
            self.shards[stats.shard_id] = stats
            self.last_seen[f"buffer shard {stats.shard_id}"] = report.time
            if self.policy is not None:
                self.policy.set_dropped(self.buffer_dropped())

    def reward_role_report(self, report: Any) -> None:
        """A ``RewardRoleReport``: kept if it is from the role's current incarnation."""
        with self.lock:
            if report.incarnation < self.scorer_epochs.get(report.index, 0):
                return  # a replaced role's last words
            self.reward_roles[report.index] = report  # liveness: its heartbeats

    # ------------------------------------------------------------------ budget rules

    def give_back_lost_steps(self, version: int, groups_per_step: int, max_reuse: int = 1) -> int:
        """From the durable logs' counts: groups retired by steps after ``version`` went with
        those steps; counted as rolled back (once) and returned to the budget. Call with the
        lock held and shard stats fresh. With ``max_reuse`` > 1 a step uses groups
        ``groups_per_step / max_reuse`` at a time (an estimate: reuse counts are not logged)."""
        consumed = sum(s.removed_total.get("consumed", 0) for s in self.shards.values())
        kept = -(-version * groups_per_step // max_reuse)
        lost = max(0, consumed - kept - self.rolled_back)
        self.rolled_back += lost
        if self.policy is not None:
            self.policy.give_back(lost)
        return lost

    def restore_admission(self, version: int, groups_per_step: int, max_reuse: int = 1) -> None:
        """A resumed run's admission count, exact from the shards' durable logs: every group a
        log received was started; those consumed by steps after the checkpoint went with those
        steps and return to the budget, as drops do. Without a log: ``version`` full batches.
        Shard stats must be fresh."""
        assert self.policy is not None
        received = sum(s.received_total for s in self.shards.values())
        with self.lock:
            if not received:
                self.policy.started = version * groups_per_step
                return
            self.policy.started = received
            self.policy.set_dropped(self.buffer_dropped())
            self.give_back_lost_steps(version, groups_per_step, max_reuse)

    def learners_restarted(
        self,
        version: int,
        forks: list[int],
        receipts: list[TakeReceipt],
        groups_per_step: int,
        max_reuse: int = 1,
    ) -> list[int]:
        """The learner group is back at ``version`` in a new epoch (``streamrl.clock``): every
        group the shards' take receipts name for later steps of the dead epoch returns to the
        budget (a step of ``max_reuse`` uses per group needs a group per ``max_reuse`` uses
        lost), and their prompts to the stream, first. Returns those prompts.

        The receipts are the truth: a rank may die before its ``BatchTaken`` report leaves,
        or with a take parked at a shard. Steps whose receipts a restarted shard lost are
        still known from the reports (the ledger) and the durable logs' counts."""
        taken = sum(len(r.prompt_indices) for r in receipts)
        owed = -(-taken // max_reuse)
        from_receipts = [i for r in receipts for i in r.prompt_indices if i >= 0]
        with self.lock:
            counted = self.give_back_lost_steps(version, groups_per_step, max_reuse)
            if owed > counted:
                if self.policy is not None:
                    self.policy.give_back(owed - counted)
                self.rolled_back += owed - counted
            elif counted > owed:
                log.warning(
                    "learner restart: the logs count %d groups taken by lost steps, the "
                    "receipts %d (a shard restarted meanwhile?)",
                    counted,
                    owed,
                )
            self.version = version
            self.weights_epoch += 1
            self.forks = list(forks)
            self.evals_forked_at(version)
            return self.prompts.roll_back(version, extra=from_receipts)

    def receipts_after(self, epoch: int, version: int) -> list[TakeReceipt]:
        """The shards' take receipts (from their newest stats) of ``epoch``'s steps after
        ``version``: what the steps a fork there took back had taken."""
        with self.lock:
            shards = list(self.shards.values())
        return [r for s in shards for r in s.receipts if r.epoch == epoch and r.step > version]

    def evals_forked_at(self, version: int) -> None:
        """The learner clock forked at ``version``: evaluations of later versions were of
        weights that are gone, so they count as neither asked nor answered; the new epoch's
        steps ask for them again. Call with the lock held."""
        self.eval_answered = min(self.eval_answered, version)
        if self.eval_requested > version:
            self.eval_requested = self.eval_answered
        self.eval_due = [v for v in self.eval_due if v <= version]

    def ask_eval(self, version: int) -> None:
        """An evaluation of ``version`` is due (call with the lock held)."""
        self.eval_requested = max(self.eval_requested, version)
        if version > self.eval_answered and version not in self.eval_due:
            self.eval_due = sorted([*self.eval_due, version])

    def eval_answer(self, requested: int) -> None:
        """An evaluation asked for at ``requested`` came back (call with the lock held)."""
        self.eval_answered = max(self.eval_answered, requested)
        self.eval_due = [v for v in self.eval_due if v > self.eval_answered]

    def eval_to_ask(self, in_order: bool) -> int:
        """The version to ask the evaluator for, -1 for none: the oldest due when it evaluates
        each in order (its own process, ``eval.runs_on``), else the newest (an evaluator in a
        generator's loop evaluates the weights it holds: one ask covers the older ones)."""
        if self.eval_requested <= self.eval_answered:
            return -1
        return self.eval_due[0] if in_order and self.eval_due else self.eval_requested

    def eval_is_live(self, report: EvalReport) -> bool:
        """Whether an evaluation was of weights on the current timeline (``streamrl.clock``):
        of the current epoch, or of an older one at or before its fork."""
        return LearnerClock(self.weights_epoch, self.version, self.forks).on_timeline(
            report.weights_epoch, report.version
        )

    def release_generator(self, generator_id: int, floors: dict[int, int] | None = None) -> int:
        """A generator is gone: its admitted groups that no shard acknowledges return to the
        budget and their prompts to the ledger (``PromptLedger.release``; ``floors`` from
        ``arrived_from``). Returns how many."""
        with self.lock:
            health = self.health.get(generator_id)
            if health is not None:
                health.released = True
            report = self.generators.pop(generator_id, None)
            above = self._arrived_above(generator_id, floors)
            if report is not None:
                arrived = sum(f + 1 for f in floors.values()) if floors is not None else 0
                arrived += sum(len(seqs) for seqs in above.values())
                if arrived > report.groups_pushed:
                    # Killed between pushing and reporting: the totals count what arrived.
                    report = msgspec.structs.replace(report, groups_pushed=arrived)
                self.ended.append(report)
            n = self.prompts.release(generator_id, floors, above)
            if self.policy is not None:
                self.policy.give_back(n)
            return n

    def arrived_from(self, generator_id: int, shards: int) -> dict[int, int] | None:
        """Per shard id (0 .. ``shards`` - 1), the seq up to which that shard acknowledges
        ``generator_id``'s current incarnation's groups (``buffers.delivery`` floors, from its
        newest stats; -1: none or no stats yet); None if its sender is not known yet (it never
        asked for admission)."""
        health = self.health.get(generator_id)
        if health is None or not health.sender:
            return None
        return {
            shard_id: (
                self.shards[shard_id].delivered.get(shard_sender(health.sender, shard_id), -1)
                if shard_id in self.shards
                else -1
            )
            for shard_id in range(shards)
        }

    def _arrived_above(
        self, generator_id: int, floors: dict[int, int] | None
    ) -> dict[int, set[int]]:
        """Per shard id of ``floors``, the seqs above its floor that shard has of the
        generator's current incarnation (its newest stats; call under the lock)."""
        health = self.health.get(generator_id)
        if floors is None or health is None or not health.sender:
            return {}
        out = {}
        for shard_id, floor in floors.items():
            stats = self.shards.get(shard_id)
            sender = shard_sender(health.sender, shard_id)
            seqs = stats.delivered_above.get(sender, ()) if stats is not None else ()
            if seqs := {seq for seq in seqs if seq > floor}:
                out[shard_id] = seqs
        return out

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
            if health.released:
                self._late_report(report)
                return True
            self.generators[report.generator_id] = report
            self.prompts.delivered(report.generator_id, report.groups_pushed)
            if self.difficulty is not None:
                self.difficulty.take(report)
            return True

    def _late_report(self, report: GeneratorReport) -> None:
        """A released generator's report that was still in flight: it updates that
        incarnation's totals in ``ended`` (counted once; the prompt ledger already settled
        it from the shards' receipts)."""
        for i, old in enumerate(self.ended):
            if (old.generator_id, old.incarnation) == (report.generator_id, report.incarnation):
                pushed = max(old.groups_pushed, report.groups_pushed)
                self.ended[i] = msgspec.structs.replace(report, groups_pushed=pushed)
                return
        self.ended.append(report)

    def heartbeat(self, beat: Heartbeat) -> None:
        """A generator's or a reward role's heartbeat; one from a replaced incarnation is
        ignored."""
        with self.lock:
            if beat.role == "reward role":
                current = beat.incarnation >= self.scorer_epochs.get(beat.index, 0)
            else:
                health = self.health.get(beat.index)
                current = health is not None and health.incarnation == beat.incarnation
            if current:
                role = f"{beat.role} {beat.index}"
                self.last_seen[role] = beat.time
                self.stalled[role] = beat.stalled_s

    def not_heard(self, role: str) -> None:
        """``role`` was (re)started: nothing heard from it yet (its grace starts now)."""
        with self.lock:
            self.last_seen.pop(role, None)
            self.stalled.pop(role, None)

    def count_restart(self, role: str, failure: str) -> int:
        """Note one more restart of ``role`` and why; returns its restarts so far."""
        with self.lock:
            self.restarts[role] = self.restarts.get(role, 0) + 1
            self.failures[role] = failure
            return self.restarts[role]


def load_prompt_ledger(run_dir: Path, version: int, lost: list[int] | None = None) -> PromptLedger:
    """The ledger a run resumed at checkpoint ``version`` continues from (written by the
    controller at every step, rolled back to ``version``; ``lost``: prompts the take receipts
    name for later steps, handed out again too); a run without one starts at 0."""
    path = run_dir / "prompts.json"
    if not path.is_file():
        return PromptLedger()
    saved = json.loads(path.read_text())
    trained = {int(v): [int(i) for i in ids] for v, ids in saved.get("trained", {}).items()}
    ledger = PromptLedger(int(saved["next_index"]), [int(i) for i in saved["retry"]], trained)
    ledger.roll_back(version, lost)
    return ledger


def shard_drops(stats: ShardStats) -> dict[str, int]:
    """Groups one shard dropped, by reason. A durable shard counts from its log, over every
    process that served it: a restarted shard's own counters start again from 0."""
    if stats.received_total:
        return {why: n for why, n in stats.removed_total.items() if why != "consumed"}
    return dict(stats.dropped)


def shard_dropped(stats: ShardStats) -> int:
    """Groups one shard dropped, all reasons (``shard_drops``)."""
    return sum(shard_drops(stats).values())
