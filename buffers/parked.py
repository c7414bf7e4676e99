"""A shard's parked takes: ``Peek`` and ``BatchRequest`` long polls, and what a take hands out.

A poll is answered at once if it can be (``k`` eligible groups, or its wait is 0), else it is
*parked* with a timer for its ``wait_ms`` (at most ``MAX_WAIT_MS``). A parked poll is tried
again whenever groups arrive or the policy changes (``answer_ready``) and answered with what
there is when its timer fires. A take (``BatchRequest``) leaves three records, all before its
reply is sent:

- the groups leave the store (``LoggedStore`` marks them on the log);
- a **take receipt** (``buffers.receipts``: epoch, the step it trains, its prompt indices)
  when the learners have a checkpoint to roll back to, pruned to those after it;
- the client's **last take** (``buffers.takes``), in memory and on the log, so a repeat of
  the request gets the same frames again, taking nothing (``retried_takes``).

Invariant: every poll is answered exactly once, except those of a replaced learner group,
which ``cancel_before`` drops unanswered (the answer would go to a dead peer and take groups
with it); a late request of such a group is answered empty. A peer that floods polls costs
bounded memory and timers: past ``MAX_PARKED_PER_PEER`` parked polls of one peer, or
``MAX_PARKED`` in all, the oldest (that peer's, or any) is answered at once with what there is.

Cost: ``answer_ready`` tries every parked poll (a peek each): O(parked) peeks per burst; a
learner rank parks one.

Example::

    parked.park(rank0, BatchRequest(7, k=4, floor=0, learner_version=3, wait_ms=5000))
    # 2 eligible groups: parked, nothing sent
    ingest.read_burst(pull); parked.answer_ready()   # 2 more arrive: answered with 4
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from streamrl.clock import LearnerClock
from streamrl.protocol import BatchRequest, Peek, PeekReply, RawBatch, TakeReceipt

from .ingest import Ingest
from .logged_store import LoggedStore
from .receipts import Receipts
from .takes import LastTakes

MAX_WAIT_MS = 600_000  # a longer long poll is cut to this
# Parked long polls per peer and in all: past either cap the oldest one (that peer's, or any)
# is answered at once with what there is. A learner rank parks one.
MAX_PARKED_PER_PEER = 16
MAX_PARKED = 1024

Reply = Callable[[bytes, Any], None]  # (peer identity, message): sent on the shard's ROUTER


@dataclass(eq=False)
class Waiting:
    """A parked long poll: answered once it can be, or by its timer when its wait runs out."""

    identity: bytes
    request: BatchRequest | Peek
    timer: asyncio.TimerHandle | None = None


class ParkedTakes:
    """Answers long polls, now or when they can be; hands out takes with their records."""

    def __init__(
        self,
        kept: LoggedStore,
        versions: LearnerClock,
        ingest: Ingest,
        reply: Reply,
        receipts: Receipts,
        takes: LastTakes[bytes],
    ) -> None:
        self.kept, self.versions, self.ingest, self.reply = kept, versions, ingest, reply
        self.receipts = receipts  # each take's prompts since the learners' newest checkpoint
        self.takes = takes  # each learner client's last take (frames), answered again
        self.waiting: list[Waiting] = []
        self.retried_takes = 0

    def park(self, identity: bytes, req: BatchRequest | Peek) -> None:
        """Answer ``req`` now if it can be, else park it (runs on the shard's loop)."""
        if isinstance(req, BatchRequest) and req.learner_epoch == self.versions.epoch:
            self.receipts.prune(req.learner_epoch, req.checkpointed)
        if self._try_answer(identity, req, expired=req.wait_ms <= 0):
            return
        mine = [w for w in self.waiting if w.identity == identity]
        if len(mine) >= MAX_PARKED_PER_PEER:
            self._answer_now(mine[0])
        elif len(self.waiting) >= MAX_PARKED:
            self._answer_now(self.waiting[0])
        waiting = Waiting(identity, req)
        self.waiting.append(waiting)
        wait_s = min(req.wait_ms, MAX_WAIT_MS) / 1e3
        waiting.timer = asyncio.get_running_loop().call_later(wait_s, self._expire, waiting)

    def answer_ready(self) -> None:
        """Answer every parked poll that can be answered now (groups came, or the policy
        changed)."""
        still = []
        for w in self.waiting:
            if self._try_answer(w.identity, w.request, expired=False):
                if w.timer is not None:
                    w.timer.cancel()
            else:
                still.append(w)
        self.waiting = still

    def cancel_before(self, epoch: int) -> int:
        """Drop, unanswered, the parked polls of learner epochs before ``epoch``; how many."""
        stale = [w for w in self.waiting if w.request.learner_epoch < epoch]
        for waiting in stale:
            if waiting.timer is not None:
                waiting.timer.cancel()
            self.waiting.remove(waiting)
        return len(stale)

    def _answer_now(self, waiting: Waiting) -> None:
        if waiting.timer is not None:
            waiting.timer.cancel()
        self._expire(waiting)

    def _expire(self, waiting: Waiting) -> None:
        self.waiting.remove(waiting)
        self._try_answer(waiting.identity, waiting.request, expired=True)

    def _try_answer(self, identity: bytes, req: BatchRequest | Peek, *, expired: bool) -> bool:
        """Answer ``req`` if it can be answered now, or with what there is if ``expired``;
        say whether it was answered."""
        store = self.kept.store
        match req:
            case Peek():
                order = self.peek(req.k, req.floor)
                if not order and not expired:
                    return False
                self.reply(identity, PeekReply(req.request_id, order, len(store)))
            case BatchRequest():
                if req.client and self._answer_repeat(identity, req):
                    return True
                if req.learner_epoch < self.versions.epoch:
                    # A replaced learner group's: its reply would be lost with what it took.
                    self.reply(identity, RawBatch(req.request_id, []))
                    return True
                if not expired and (len(store) < req.k or len(self.peek(req.k, req.floor)) < req.k):
                    return False
                groups = store.take(req.k, req.floor)
                if groups and req.checkpointed >= 0:  # without a checkpoint none is needed
                    indices = [g.prompt_index for g in groups]
                    step = req.learner_version + 1  # the step this batch trains
                    self.receipts.add(TakeReceipt(req.learner_epoch, step, indices))
                if req.client and groups:
                    self.takes.put(req.client, req.request_id, [g.frame for g in groups])
                    self.kept.record_take(req.client, req.request_id, groups)
                frames = [msgspec.Raw(g.frame) for g in groups]
                self.reply(identity, RawBatch(req.request_id, frames))
                self.ingest.admit_held()  # the take freed space
        return True

    def _answer_repeat(self, identity: bytes, req: BatchRequest) -> bool:
        """Answer a request that is not a new take of its client (``buffers.takes``): the
        same frames again for a repeat of its last take, none for an older request."""
        frames = self.takes.answer(req.client, req.request_id)
        if frames is None:
            return False
        self.retried_takes += bool(frames)
        self.reply(identity, RawBatch(req.request_id, [msgspec.Raw(f) for f in frames]))
        return True

    def peek(self, k: int, floor: int) -> list[tuple[int, float]]:
        """Sort keys (``PeekReply.order``) of the groups ``store.take(k, floor)`` would
        return next, in its order."""
        store = self.kept.store
        freshest = store.policy.sampling == "freshest"
        return [(-g.min_version if freshest else 0, g.finished_at) for g in store.peek(k, floor)]

    def figures(self, with_receipts: bool) -> dict[str, Any]:
        """``ShardStats`` fields this part owns; the receipts only when asked (a learner
        restart reads them, the periodic report does not)."""
        receipts = list(self.receipts.items) if with_receipts else []
        return {"retried_takes": self.retried_takes, "receipts": receipts}
