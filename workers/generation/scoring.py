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

Exactly once. Request ids are ``<sender>-<n>``, unique per process; a resend is the same
frame, so the same id: the role replaces a queued copy rather than queue it twice, and drops
a request still queued ``scoring.timeout_s`` after it arrived (``ScoreRequest.expires_in_s``:
by then this side has sent it again or refused its group). A reply whose id is not
outstanding (answered already: a retried request answered twice) is counted in
``duplicates`` and ignored; a group is settled once, when its last outstanding request is
answered. A request is sent again when it is older than ``scoring.timeout_s`` (``timeouts``),
or at once when admission says its role restarted (``Receipts.scorer_epochs`` rose: what was
in flight to it is gone; ``Receipts.scorer_endpoints`` says where the new one listens, and
the DEALER is reconnected there when it moved). After ``scoring.max_attempts`` sends, or an
error reply (the scorer raised on this request, or it was quarantined for killing the role
twice), its group is refused (``refused``, logged with the reason): it is pushed marked
``unscored``, so the shard counts and drops it (``invalid: unscored``), which returns its
admission budget and settles its prompt like any dropped group's; no learner sees it.

A teacher (``rewards: - teacher``, docs/design.md §7d) is one more served role: it is sent
the group's tokens as sampled (only the groups of its ``sources``, when it names some) and
answers per-token log-probabilities, which the settled group's trajectories carry
(``streamrl.rewards.distill``); an answer whose arrays do not match the responses' tokens
refuses the group like an error reply. Evaluations are not sent to teachers.

An evaluation's responses are scored the same way without a group (``score_responses``,
``score_later``): the generator goes on, and the callback gets the scores that came in by
``scoring.timeout_s``. A run whose rewards are all rules holds ``NoScoring``
(``workers.generation.generator_delivery``) instead: nothing waits.

A generator that dies with groups waiting loses them with its process; their grants were
never pushed, so the supervisor returns them to the budget (docs/design.md §3).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
from streamrl.rewards.distill import attach_teachers, attach_top_k, check_answer
from streamrl.transport import Codec, make_socket

log = logging.getLogger(__name__)

# Per served reward index: the scores (None where unscorable) and the scorer's identity.
Served = dict[int, tuple[list[float | None], str]]
# (group, its served scores) -> the group settled (its reward set): ``Sampler.settle``.
Settle = Callable[[TrajectoryGroup, Served], None]


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
    incarnations: dict[int, int] = field(default_factory=dict)  # reward -> who scored it
    tokens: dict[int, list[bytes]] = field(default_factory=dict)  # teacher -> its arrays
    top: dict[int, tuple[list[bytes], list[bytes]]] = field(default_factory=dict)  # top-k's
    teacher_version: int = -1  # the lagged teacher's that scored it (-1: none)


@dataclass
class _Eval:
    """An evaluation's responses waiting for their served scores (``score_later``)."""

    ids: dict[int, str]  # reward index -> request id
    size: int
    deadline: float
    done: Callable[[Served], None]


class GroupScoring:
    """Groups waiting for served scores, and the sockets to the reward roles.

    Invariant: each group is returned by ``pump`` exactly once (settled, or refused marked
    ``unscored``), whatever is resent, answered twice, or lost with a role.

    Example: submit([g0, g1]); the role answers g1, then g0 -> pump returns [g1], then [g0]
    (settle order); a role restart (its epoch rises) before any answer resends both."""

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
        # Teachers by reward index: their routing (data sources; empty: every group).
        self.teachers = {
            i: config.rewards[i].teacher.sources  # type: ignore[union-attr]
            for i in endpoints
            if config.rewards[i].kind == "teacher"
        }
        # Lagged teachers (``teacher.model: self``) by reward index: their lag bound.
        self.lag_bounds = {
            i: config.rewards[i].teacher.lag_bound  # type: ignore[union-attr]
            for i in self.teachers
            if config.rewards[i].lagged_teacher
        }
        self.ctx = ctx
        self.endpoints: dict[int, str] = {}
        self.sockets: dict[int, zmq.Socket] = {}
        self.poller = zmq.Poller()
        for reward, endpoint in endpoints.items():
            self._connect(reward, endpoint)
        self.codec: Codec[ScoreReply] = Codec(ScoreReply, "scoring replies")
        self.ids = itertools.count()
        self.waiting: dict[str, _Waiting] = {}  # request id -> its group's entry
        self.groups: list[_Waiting] = []  # in submission order
        self.epochs: dict[int, int] = {}
        # Groups for the next pump: refused ones (marked ``unscored``).
        self.ready: list[TrajectoryGroup] = []
        # Requests outside any group (``score_later``: an evaluation's responses): id ->
        # reply, and the evaluations they belong to.
        self.direct: dict[str, ScoreReply | None] = {}
        self.evals: list[_Eval] = []
        self.figures = ScoringFigures(unparsable={label: 0 for label in self.labels.values()})

    @property
    def pending(self) -> int:
        """Groups and evaluations waiting for scores: ``pump`` has work while this is > 0."""
        return len(self.groups) + len(self.evals)

    def snapshot(self) -> ScoringFigures:
        """The figures now (a copy: they go on), with the groups waiting."""
        return msgspec.structs.replace(
            self.figures, waiting=len(self.groups), unparsable=dict(self.figures.unparsable)
        )

    def _connect(self, reward: int, endpoint: str) -> None:
        """A DEALER to ``reward``'s role at ``endpoint`` (replacing the one it had: replies
        still bound for the old socket are lost, and the caller sends its requests again)."""
        old = self.sockets.pop(reward, None)
        if old is not None:
            self.poller.unregister(old)
            old.close(linger=0)
        sock = make_socket(self.ctx, zmq.DEALER)
        sock.connect(endpoint)
        self.sockets[reward], self.endpoints[reward] = sock, endpoint
        self.poller.register(sock, zmq.POLLIN)

    def _request(
        self, request_id: str, items: list[ScoreItemWire], group: TrajectoryGroup | None = None
    ) -> bytes:
        # The role drops it if it is still queued when this side would send it again.
        timeout = self.config.scoring.timeout_s
        # The group's clock, which a lagged teacher follows (an evaluation's has none).
        version, epoch = (group.max_version, group.weights_epoch) if group is not None else (-1, 0)
        return self.codec.encode(ScoreRequest(request_id, items, timeout, version, epoch))

    # ------------------------------------------------------------------ requests

    def submit(self, groups: list[TrajectoryGroup]) -> list[TrajectoryGroup]:
        """Send each group's responses to every served reward's role; they wait here.
        Returns the groups with nothing to score (refused by their rules, ``unscored``):
        the generator pushes those at once."""
        now = time.monotonic()
        for group in groups:
            if group.unscored:
                continue
            entry = _Waiting(group, now)
            question = self.question_of(group)
            items = [
                ScoreItemWire(
                    question, t.response_text, group.ground_truth, stopped=t.finish_reason == "stop"
                )
                for t in group.trajectories
            ]
            # What a teacher is sent: the tokens as sampled, not the text.
            tokens = (
                [
                    ScoreItemWire(question, "", "", t.prompt_ids, t.response_ids, t.temperature)
                    for t in group.trajectories
                ]
                if self.teachers
                else []
            )
            for reward in self.sockets:
                payload = items
                if reward in self.teachers:
                    if not _routed(self.teachers[reward], group.data_source):
                        continue
                    payload = tokens
                request_id = f"{self.sender}-{next(self.ids)}"
                frame = self._request(request_id, payload, group)
                entry.outstanding[request_id] = _Request(reward, frame, now)
                self.waiting[request_id] = entry
                self._send(reward, frame)
            self.groups.append(entry)
        return [group for group in groups if group.unscored]

    def _send(self, reward: int, frame: bytes) -> None:
        try:
            self.sockets[reward].send(frame, zmq.NOBLOCK)
            self.figures.sent += 1
        except zmq.Again:  # the role's pipe is full (it is down): the retry sends it
            log.debug("scoring: reward %d not reachable now; will retry", reward)

    def take_epochs(
        self, scorer_epochs: dict[int, int], scorer_endpoints: dict[int, str] | None = None
    ) -> None:
        """A reward role restarted (its epoch rose): reconnect if it listens elsewhere now,
        and send it what was in flight again."""
        for reward, endpoint in (scorer_endpoints or {}).items():
            if reward in self.sockets and endpoint != self.endpoints[reward]:
                log.info(
                    "scoring: reward role %s moved to %s; reconnecting",
                    self.labels.get(reward, reward),
                    endpoint,
                )
                self._connect(reward, endpoint)
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
        the overdue, and return the groups this call settled (in submission order among
        themselves; a group answered before an earlier one is not held back for it)."""
        events = dict(self.poller.poll(wait_ms if self.pending else 0))
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
        self._finish_evals()
        return self._settled()

    def score_later(self, items: list[ScoreItemWire], done: Callable[[Served], None]) -> None:
        """Send ``items`` (an evaluation's responses) to every served reward's role and
        return at once; ``done`` is called from a later ``pump`` with every reward's scores
        that came in (per reward index: scores and scorer identity), once all are in or
        ``scoring.timeout_s`` passed (a reward that did not answer, or answered with an
        error, is left out). Sent once: an evaluation is a figure, not training data."""
        ids = {}
        for reward in self.sockets:
            if reward in self.teachers:  # a teacher scores training tokens only
                continue
            request_id = f"{self.sender}-{next(self.ids)}"
            ids[reward] = request_id
            self.direct[request_id] = None
            self._send(reward, self._request(request_id, items))
        deadline = time.monotonic() + self.config.scoring.timeout_s
        self.evals.append(_Eval(ids, len(items), deadline, done))

    def score_responses(
        self,
        samples: list[dict[str, Any]],
        questions: Callable[[], dict[str, str]],
        done: Callable[[Served], None],
    ) -> None:
        """An evaluation's responses (``EvalResult.samples``) to ``score_later``, each shown
        with its question (``questions()``: prompt id -> question, read now: an evaluation
        made in the evaluation process comes back to a generator that never loaded the
        held-out set); with no response, ``done({})`` at once."""
        asked = questions()
        items = [
            ScoreItemWire(
                asked.get(s["prompt_id"], ""),
                s["response"],
                s["ground_truth"],
                stopped=s["stopped"],
            )
            for s in samples
        ]
        if items:
            self.score_later(items, done)
        else:
            done({})

    def _finish_evals(self, now: float | None = None) -> None:
        """Hand each evaluation whose replies are all in (or whose time is up) its scores."""
        now = time.monotonic() if now is None else now
        for entry in list(self.evals):
            replies = {r: self.direct.get(i) for r, i in entry.ids.items()}
            if any(reply is None for reply in replies.values()) and now < entry.deadline:
                continue
            self.evals.remove(entry)
            for request_id in entry.ids.values():
                self.direct.pop(request_id, None)
            entry.done(
                {
                    reward: (list(reply.scores), reply.identity)
                    for reward, reply in replies.items()
                    if reply is not None and not reply.error and len(reply.scores) == entry.size
                }
            )

    def finish_evals(self) -> None:
        """Leaving: hand every waiting evaluation what came in so far."""
        self._finish_evals(now=float("inf"))

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
        if reward in self.teachers:
            top_k = self.config.rewards[reward].teacher.top_k  # type: ignore[union-attr]
            mismatch = check_answer(
                entry.group.trajectories,
                reply.token_logprobs,
                reply.top_ids,
                reply.top_logprobs,
                top_k,
            )
            mismatch = mismatch or self._lag_refusal(reward, entry, reply.teacher_version)
            if mismatch:
                self._refuse(entry, f"{self.labels[reward]}: {mismatch}")
                return
            entry.tokens[reward] = list(reply.token_logprobs)
            if top_k:
                entry.top[reward] = (list(reply.top_ids), list(reply.top_logprobs))
        else:  # a teacher's scores are figures (mean logprobs): nothing is unparsable
            label = self.labels[reward]
            self.figures.unparsable[label] = self.figures.unparsable.get(label, 0) + sum(
                s is None for s in reply.scores
            )
        entry.scores[reward] = (list(reply.scores), reply.identity)
        entry.incarnations[reward] = reply.incarnation

    def _lag_refusal(self, reward: int, entry: _Waiting, teacher_version: int) -> str:
        """Why a lagged teacher's answer is refused ("" when it is not): it scored with a copy
        of the student more than ``teacher.lag_bound`` versions older than the group."""
        if reward not in self.lag_bounds:
            return ""
        lag, bound = entry.group.max_version - teacher_version, self.lag_bounds[reward]
        if teacher_version < 0 or lag > bound:
            self.figures.teacher_lagged += 1
            return f"teacher copy of version {teacher_version} lags the group by {lag} > {bound}"
        entry.teacher_version = teacher_version
        return ""

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
            # In the order ``settle`` appends the scorers' identities (reward index).
            entry.group.scorer_incarnations = [entry.incarnations[r] for r in sorted(entry.scores)]
            if entry.tokens:
                self._attach_teachers(entry)
            self.settle(entry.group, entry.scores)
            self.figures.wait_s += now - entry.submitted
        return ready + [e.group for e in done]

    def _attach_teachers(self, entry: _Waiting) -> None:
        """The teachers' answers onto the group's trajectories (``rewards.distill``); each
        teacher's part is the responses' sampled reverse KL to it."""
        rewards = self.config.rewards
        sampled = {
            r: (rewards[r].weight if rewards[r].teacher.sampled_kl else 0.0, arrays)  # type: ignore[union-attr]
            for r, arrays in entry.tokens.items()
        }
        figures = attach_teachers(entry.group.trajectories, sampled)
        for r, values in figures.items():
            entry.scores[r] = (values, entry.scores[r][1])
        for r, (ids, logprobs) in entry.top.items():
            attach_top_k(entry.group.trajectories, rewards[r].weight, ids, logprobs)
        if set(entry.tokens) <= set(self.lag_bounds):  # a lagged copy alone scored it
            for t in entry.group.trajectories:
                t.teacher_version = entry.teacher_version

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close(linger=0)


def _routed(sources: list[str], data_source: str) -> bool:
    """Whether a teacher of ``sources`` (empty: every one) scores a group of ``data_source``."""
    return not sources or data_source in sources
