"""The generator's side of served rewards (docs/design.md §7c): groups wait here for their
reward models' and judges' scores while the generator goes on sampling.

A group sampled by a job with served rewards (``RewardSpec.served``) is handed to
``GroupScoring.submit``: one ``ScoreRequest`` per served reward goes to that reward's role
(a DEALER per role, to the role's ROUTER), and the group waits. ``pump`` (called between
decode steps, between calls and while waiting for weights or admission: the generator's
one thread owns these sockets) takes the replies, sends again what is overdue, and returns
the groups whose every score is in, settled by the sampler (``Sampler.settle``: normalised,
weighted, summed), for the generator to push. So scoring never holds the engine: the only
cost on the generator's path is encoding requests and decoding replies.

Exactly once. Request ids are ``<sender>-<n>``, unique per process. A reply whose id is not
outstanding (answered already: a retried request answered twice) is counted in
``duplicates`` and ignored; a group is settled once, when its last outstanding request is
answered. A request is sent again when it is older than ``scoring.timeout_s`` (``timeouts``),
or at once when admission says its role restarted (``Receipts.scorer_epochs`` rose: what was
in flight to it is gone). After ``scoring.max_attempts`` sends, or an error reply, its group
is refused (``refused``, logged with the reason): it is pushed marked ``unscored``, so the
shard counts and drops it (``invalid: unscored``), which returns its admission budget and
settles its prompt like any dropped group's; no learner sees it.

A generator that dies with groups waiting loses them with its process; their grants were
never pushed, so the supervisor returns them to the budget (docs/design.md §3).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import zmq

from streamrl.config import Config
from streamrl.protocol import (
    ScoreItemWire,
    ScoreReply,
    ScoreRequest,
    ScoringFigures,
    TrajectoryGroup,
)
from streamrl.transport import Codec, make_socket

log = logging.getLogger(__name__)

# (group, per served reward index: the scores, None where unscorable, and the scorer's
# identity) -> the group settled (its reward set): ``Sampler.settle``.
Settle = Callable[[TrajectoryGroup, dict[int, tuple[list[float | None], str]]], None]


@dataclass
class _Request:
    reward: int  # index in ``rewards:``
    frame: bytes
    sent_at: float
    attempts: int = 1


@dataclass
class _Waiting:
    group: TrajectoryGroup
    submitted: float
    outstanding: dict[str, _Request] = field(default_factory=dict)  # request id -> request
    scores: dict[int, tuple[list[float | None], str]] = field(default_factory=dict)


class GroupScoring:
    """Groups waiting for served scores, and the sockets to the reward roles."""

    def __init__(
        self,
        ctx: zmq.Context,
        config: Config,
        endpoints: dict[int, str],
        sender: str,
        question_of: Callable[[TrajectoryGroup], str],
        settle: Settle,
    ) -> None:
        self.config, self.sender = config, sender
        self.question_of, self.settle = question_of, settle
        self.labels = {i: config.rewards[i].display_name() for i in endpoints}
        self.sockets: dict[int, zmq.Socket] = {}
        for reward, endpoint in endpoints.items():
            sock = make_socket(ctx, zmq.DEALER)
            sock.connect(endpoint)
            self.sockets[reward] = sock
        self.poller = zmq.Poller()
        for sock in self.sockets.values():
            self.poller.register(sock, zmq.POLLIN)
        self.codec: Codec[ScoreReply] = Codec(ScoreReply, "scoring replies")
        self.ids = itertools.count()
        self.waiting: dict[str, _Waiting] = {}  # request id -> its group's entry
        self.groups: list[_Waiting] = []  # in submission order
        self.epochs: dict[int, int] = {}
        # Groups for the next pump: refused ones (marked ``unscored``) and any settled while
        # ``score_now`` waited.
        self.ready: list[TrajectoryGroup] = []
        # Requests outside any group (``score_now``: an evaluation's responses): id -> reply.
        self.direct: dict[str, ScoreReply | None] = {}
        self.figures = ScoringFigures(unparsable={label: 0 for label in self.labels.values()})

    @property
    def pending(self) -> int:
        return len(self.groups)

    def snapshot(self) -> ScoringFigures:
        """The figures now (a copy: they go on), with the groups waiting."""
        return msgspec.structs.replace(
            self.figures, waiting=self.pending, unparsable=dict(self.figures.unparsable)
        )

    # ------------------------------------------------------------------ requests

    def submit(self, groups: list[TrajectoryGroup]) -> None:
        """Send each group's responses to every served reward's role; they wait here."""
        now = time.monotonic()
        for group in groups:
            entry = _Waiting(group, now)
            question = self.question_of(group)
            items = [
                ScoreItemWire(question, t.response_text, group.ground_truth)
                for t in group.trajectories
            ]
            for reward in self.sockets:
                request_id = f"{self.sender}-{next(self.ids)}"
                frame = self.codec.encode(ScoreRequest(request_id, items))
                entry.outstanding[request_id] = _Request(reward, frame, now)
                self.waiting[request_id] = entry
                self._send(reward, frame)
            self.groups.append(entry)

    def _send(self, reward: int, frame: bytes) -> None:
        try:
            self.sockets[reward].send(frame, zmq.NOBLOCK)
            self.figures.sent += 1
        except zmq.Again:  # the role's pipe is full (it is down): the retry sends it
            log.debug("scoring: reward %d not reachable now; will retry", reward)

    def take_epochs(self, scorer_epochs: dict[int, int]) -> None:
        """A reward role restarted (its epoch rose): send it what was in flight again."""
        for reward, epoch in scorer_epochs.items():
            if epoch <= self.epochs.get(reward, 0):
                continue
            self.epochs[reward] = epoch
            again = [r for e in self.groups for r in e.outstanding.values() if r.reward == reward]
            if again:
                log.info(
                    "scoring: reward role %s restarted; sending %d request(s) again",
                    self.labels.get(reward, reward),
                    len(again),
                )
            for request in again:
                self._resend(request)

    def _resend(self, request: _Request) -> None:
        request.attempts += 1
        request.sent_at = time.monotonic()
        self.figures.retries += 1
        self._send(request.reward, request.frame)

    # ------------------------------------------------------------------ replies

    def pump(self, wait_ms: int = 0) -> list[TrajectoryGroup]:
        """Take the replies that are in (waiting up to ``wait_ms`` for the first), resend
        the overdue, and return the groups now settled, in submission order."""
        events = dict(self.poller.poll(wait_ms if self.groups else 0))
        for reward, sock in self.sockets.items():
            if sock not in events:
                continue
            while True:
                try:
                    frame = sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._take(reward, frame)
        self._retry_overdue()
        return self._settled()

    def score_now(
        self, items: list[ScoreItemWire], timeout_s: float
    ) -> dict[int, tuple[list[float | None], str]]:
        """Every served reward's scores of ``items`` (per reward index: scores and scorer
        identity), waiting for them (groups' replies are taken meanwhile and settle as
        usual); a reward that did not answer within ``timeout_s`` is left out."""
        ids = {}
        for reward in self.sockets:
            request_id = f"{self.sender}-{next(self.ids)}"
            ids[reward] = request_id
            self.direct[request_id] = None
            self._send(reward, self.codec.encode(ScoreRequest(request_id, items)))
        deadline = time.monotonic() + timeout_s
        while any(self.direct[i] is None for i in ids.values()) and time.monotonic() < deadline:
            settled = self.pump(wait_ms=50)  # (pump swaps ``ready`` out: extend after it)
            self.ready.extend(settled)  # pushed by the generator's next pump
        out = {}
        for reward, request_id in ids.items():
            reply = self.direct.pop(request_id)
            if reply is not None and not reply.error and len(reply.scores) == len(items):
                out[reward] = (list(reply.scores), reply.identity)
        return out

    def _take(self, reward: int, frame: bytes) -> None:
        reply = self.codec.decode(frame)  # a malformed one is counted and dropped
        if reply is None:
            return
        if reply.request_id in self.direct:
            if self.direct[reply.request_id] is None:
                self.direct[reply.request_id] = reply
            else:
                self.figures.duplicates += 1
            return
        entry = self.waiting.pop(reply.request_id, None)
        if entry is None:
            self.figures.duplicates += 1
            return
        entry.outstanding.pop(reply.request_id)
        size = len(entry.group.trajectories)
        if reply.error or len(reply.scores) != size:
            reason = reply.error or f"{len(reply.scores)} scores for {size} responses"
            self._refuse(entry, f"{self.labels[reward]}: {reason}")
            return
        label = self.labels[reward]
        self.figures.unparsable[label] = self.figures.unparsable.get(label, 0) + sum(
            s is None for s in reply.scores
        )
        entry.scores[reward] = (list(reply.scores), reply.identity)

    def _retry_overdue(self) -> None:
        now, scoring = time.monotonic(), self.config.scoring
        for entry in list(self.groups):
            for request in list(entry.outstanding.values()):
                if now - request.sent_at < scoring.timeout_s:
                    continue
                self.figures.timeouts += 1
                if request.attempts >= scoring.max_attempts:
                    self._refuse(
                        entry,
                        f"{self.labels[request.reward]}: no reply in {request.attempts} "
                        f"attempt(s) of {scoring.timeout_s:g} s",
                    )
                    break
                self._resend(request)

    def _refuse(self, entry: _Waiting, reason: str) -> None:
        if entry not in self.groups:
            return
        self.groups.remove(entry)
        for request_id in entry.outstanding:
            self.waiting.pop(request_id, None)
        entry.outstanding.clear()
        self.figures.refused += 1
        log.warning("scoring: group of prompt %d refused: %s", entry.group.prompt_index, reason)
        entry.group.unscored = reason[:200]
        for t in entry.group.trajectories:
            t.reward = float("nan")
        self.ready.append(entry.group)

    def _settled(self) -> list[TrajectoryGroup]:
        ready, self.ready = self.ready, []
        done = [e for e in self.groups if not e.outstanding]
        if not done:
            return ready
        now = time.monotonic()
        for entry in done:
            self.groups.remove(entry)
            self.settle(entry.group, entry.scores)
            self.figures.wait_s += now - entry.submitted
        return ready + [e.group for e in done]

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close(linger=0)
