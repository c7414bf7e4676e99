"""Reward role: serves one reward model, judge or teacher to every generator (docs/design.md
§7c, §7d).

Its ROUTER takes ``ScoreRequest``s (one group's responses each) from any number of
generators; ``serve`` reads what has arrived, waits ``scoring.batch_wait_ms`` for more once
it has some, scores up to ``scoring.max_batch`` responses in one forward pass whatever group
or generator they came from, and answers each request with its scores and the scorer's
identity (``"<label>@<weights hash>"``). Queue and batch rules are
``workers.reward_roles.score_queue``:
a resend replaces its queued copy, a request its sender gave up on is dropped unscored
(``expired``), and a batch whose scoring raises is split until only the requests that raise
are answered with the error (the generator refuses those groups with the reason); a frame
that does not decode is counted and dropped. Every second a ``RewardRoleReport`` goes to the
controller, and one before each batch naming the requests in it (``scoring_ids``).

Restart: the controller starts a dead role again, on the same port where it can
(``RewardRoleSpec.port``), raises the role's epoch in admission replies
(``Receipts.scorer_epochs``, with its endpoint in ``scorer_endpoints``) so the generators
send what was in flight to it again, and tells it which requests its predecessors died
scoring (``RewardRoleSpec.suspects``): scored alone after one death, refused after two.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from pathlib import Path

import torch
import zmq
from msgspec.structs import astuple

from streamrl import failpoints
from streamrl.config import Config, RewardSpec
from streamrl.cores import role_threads
from streamrl.hardware import resolve_compute_dtype
from streamrl.protocol import RewardRoleReport, ScoreReply, ScoreRequest, unpack_float32
from streamrl.rewards.scorer import ScoreItem, Scorer, TokenAnswer, TokenScorer
from streamrl.role_specs import GeneratorSpec, RewardRoleSpec
from streamrl.transport import Codec, bind_random, make_socket, resolve_host
from streamrl.workers.generation.generator_reports import HeartbeatThread
from streamrl.workers.progress import Progress
from streamrl.workers.reward_roles.score_queue import (
    QUARANTINE_AFTER,
    Pending,
    RequestQueue,
    score_batch,
)

log = logging.getLogger(__name__)

REPORT_EVERY_S = 1.0
LATENCY_WINDOW = 256  # requests the latency percentiles are taken over


def make_scorer(
    config: Config,
    reward: RewardSpec,
    model_dir: Path,
    seed: int = 0,
    student: GeneratorSpec | None = None,
) -> Scorer | TokenScorer:
    """The reward model, judge or teacher that ``reward`` names, on ``scoring.device``; a
    lagged teacher subscribes to the weights ``student`` names."""
    device = config.scoring.device
    dtype = getattr(torch, resolve_compute_dtype(config.model.compute_dtype, device))
    label = reward.display_name()
    if reward.lagged_teacher:
        from streamrl.workers.reward_roles.lagged_teacher import LaggedTeacher

        assert reward.teacher is not None and student is not None
        return LaggedTeacher(student, reward.teacher, label, device=device, compute_dtype=dtype)
    if reward.kind == "model":
        from streamrl.rewards.model import RewardModelScorer

        return RewardModelScorer(model_dir, label, device=device, dtype=dtype)
    if reward.kind == "teacher":
        from streamrl.workers.reward_roles.teacher import TeacherScorer

        assert reward.teacher is not None
        return TeacherScorer(
            model_dir,
            label,
            device=device,
            compute_dtype=dtype,
            top_k=reward.teacher.top_k,
            target_tau=reward.teacher.target_tau,
        )
    if reward.kind == "judge":
        from streamrl.workers.reward_roles.judge import JudgeScorer

        assert reward.judge is not None
        return JudgeScorer(
            reward.judge, model_dir, label, device=device, compute_dtype=dtype, seed=seed
        )
    raise ValueError(f"reward {label!r} is a rule: it is scored in the generator")


class RewardRole:
    """One reward role process: its scorer, its ROUTER, its reports."""

    def __init__(self, spec: RewardRoleSpec) -> None:
        config = spec.config
        self.spec, self.config = spec, config
        self.reward = config.rewards[spec.index]
        threads = role_threads(config, "scoring", spec.cores, len(os.sched_getaffinity(0)))
        self.threads = threads
        torch.set_num_threads(threads)
        self.ctx = zmq.Context()
        self.router = make_socket(self.ctx, zmq.ROUTER, rcvhwm=10_000, sndhwm=10_000)
        self.endpoint = _bind(self.router, resolve_host(spec.bind_host), spec.index, spec.port)
        self.reports = make_socket(self.ctx, zmq.PUSH, sndhwm=16)
        self.reports.connect(spec.report_endpoint)
        # First, before the scorer loads: the controller hears this process from the start,
        # and replaces it when it goes silent (SIGSTOP) or stalls (a wedged forward: the
        # beats go on, its progress does not) as when it dies.
        self.progress = Progress()  # a step per batch scored; work: a batch in hand
        self.heartbeat = HeartbeatThread(
            self.ctx,
            spec.report_endpoint,
            spec.index,
            spec.incarnation,
            role="reward role",
            progress=self.progress,
        )
        started = time.monotonic()
        self.scorer = make_scorer(
            config, self.reward, Path(spec.model_dir), config.run.seed, spec.student
        )
        # A lagged teacher (``workers.reward_roles.lagged_teacher``) hears each request's
        # clock and moves its weights between batches; other scorers' weights are fixed.
        self._follow = getattr(self.scorer, "follow", None)
        self._tend = getattr(self.scorer, "tend", None)
        log.info(
            "reward role %d: %s ready in %.1f s (%d threads)",
            spec.index,
            self.scorer.identity,
            time.monotonic() - started,
            threads,
        )
        self.codec: Codec[ScoreRequest] = Codec(ScoreRequest, f"reward role {spec.index}")
        self.queue = RequestQueue(spec.suspects)
        self.latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)
        self.figures = RewardRoleReport(
            spec.index, spec.incarnation, self.reward.display_name(), self.scorer.identity, 0.0
        )
        self.ready_at = time.monotonic()
        self._stop = threading.Event()

    # ------------------------------------------------------------------ serving

    def serve(self) -> None:
        """Answer requests until ``stop``."""
        torch.set_num_threads(self.threads)  # Ray runs this on another thread than __init__
        next_report = 0.0
        while not self._stop.is_set():
            if not self.queue:
                self._read(timeout_ms=100)
            if self.queue and self.config.scoring.batch_wait_ms:
                self._read(timeout_ms=self.config.scoring.batch_wait_ms)
            self._read(timeout_ms=0)
            if self._tend is not None:
                self._tend()
            if self.queue:
                with self.progress.working():
                    self._score_batch()
            if time.monotonic() >= next_report:
                self._report()
                next_report = time.monotonic() + REPORT_EVERY_S
        self._report()

    def _read(self, timeout_ms: int) -> None:
        if not self.router.poll(timeout_ms, zmq.POLLIN):
            return
        while True:
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            routed = self.codec.decode_routed(frames)  # a malformed one: counted, dropped
            if routed is None:
                continue
            peer, request = routed
            if self._follow is not None and request.version >= 0:
                self._follow(request.version, request.weights_epoch)
            self.queue.add(peer, request, time.monotonic())
            self.figures.requests += 1
        for pending in self.queue.quarantined:  # what killed two of this role's incarnations
            self.figures.quarantined += 1
            deaths = self.queue.suspects.get(pending.request.request_id, QUARANTINE_AFTER)
            self._answer(pending, [], f"quarantined: {deaths} reward role(s) died scoring it")
        self.queue.quarantined.clear()

    def _score_batch(self) -> None:
        """The oldest live requests, up to ``scoring.max_batch`` responses (at least one
        request whole), scored in one call where none raises (``score_batch``), each
        answered. The controller hears which requests are in the batch before it starts."""
        now = time.monotonic()
        batch = self.queue.take(self.config.scoring.max_batch, now)
        if not batch:
            return
        self.figures.scoring_ids = [p.request.request_id for p in batch]
        self._report()  # if this batch kills the role, its requests are suspects
        # ScoreItemWire is ScoreItem on the wire, field for field (test_score_queue holds it).
        requests = [[ScoreItem(*astuple(i)) for i in p.request.items] for p in batch]
        start = time.monotonic()
        for pending in batch:
            self.figures.queue_wait_s += start - pending.received
        failpoints.hit("reward_role.score", self.spec.incarnation)  # the chaos lane's wedge
        answers, failed = score_batch(self.scorer.score, requests)
        if failed:
            errors = [error for _, error in answers if error]
            log.warning(
                "reward role %d: %d scoring call(s) raised on a batch of %d request(s); %d "
                "answered with the error%s",
                self.spec.index,
                failed,
                len(batch),
                len(errors),
                f" (the first: {errors[0]})" if errors else "",
            )
        done = time.monotonic()
        self.figures.failures += failed
        self.figures.busy_s += done - start
        self.figures.batches += 1
        self.figures.items += sum(len(r) for r in requests)
        self.figures.scoring_ids = []
        per_token = getattr(self.scorer, "per_token", False)
        for pending, (scores, error) in zip(batch, answers, strict=True):
            if per_token:  # a teacher's arrays: each item's mean is its score
                self._answer(
                    pending, [_mean_logprob(a.logprobs) for a in scores], error, list(scores)
                )
            else:
                self.figures.unparsable += sum(s is None for s in scores)
                self._answer(pending, [_finite_or_none(s) for s in scores], error)
            self.latencies.append(done - pending.received)

    def _answer(
        self,
        pending: Pending,
        scores: list[float | None],
        error: str,
        tokens: list[TokenAnswer] | None = None,
    ) -> None:
        tokens = tokens or []
        top = any(a.top_ids for a in tokens)
        reply = ScoreReply(
            pending.request.request_id,
            scores,
            self.scorer.identity,
            error,
            incarnation=self.spec.incarnation,
            token_logprobs=[a.logprobs for a in tokens],
            top_ids=[a.top_ids for a in tokens] if top else [],
            top_logprobs=[a.top_logprobs for a in tokens] if top else [],
            teacher_version=getattr(self.scorer, "version", -1),
        )
        self.router.send_multipart([pending.peer, self.codec.encode(reply)])

    def _report(self) -> None:
        figures = self.figures
        figures.time = time.time()
        figures.up_s = time.monotonic() - self.ready_at
        figures.queue_depth = len(self.queue)
        figures.malformed = self.codec.malformed_total
        figures.expired, figures.replaced = self.queue.expired, self.queue.replaced
        if self.latencies:
            ordered = sorted(self.latencies)
            figures.latency_p50_s = ordered[len(ordered) // 2]
            figures.latency_p95_s = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        try:
            self.reports.send(self.codec.encode(figures), zmq.NOBLOCK)
        except zmq.Again:  # the controller is behind: the next report carries the totals
            pass

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self.heartbeat.stop()
        shutdown = getattr(self.scorer, "shutdown", None)
        if shutdown is not None:  # a judge's vLLM engine
            shutdown()
        self.ctx.destroy(linger=0)


BIND_RETRY_S = 30.0  # a restarted role's predecessor may hold its port a moment longer


def _bind(router: zmq.Socket, host: str, index: int, port: int) -> str:
    """Bind the role's ROUTER on ``port`` (0: any), waiting while the port is still held: a
    killed predecessor (ray.kill is asynchronous) releases it when its process is gone. A
    port held longer (another process took it) is given up for any free one: generators
    learn the endpoint from admission replies (``Receipts.scorer_endpoints``)."""
    deadline = time.monotonic() + BIND_RETRY_S
    while True:
        try:
            return bind_random(router, host, f"reward role {index}", port)
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or not port:
                raise
            if time.monotonic() > deadline:
                log.warning("reward role %d: port %d still held; binding another", index, port)
                port = 0
                continue
            time.sleep(0.2)


def _mean_logprob(values: bytes) -> float | None:
    """A teacher's item: the mean of its per-token log-probabilities (None: no tokens)."""
    logprobs = unpack_float32(values)
    return _finite_or_none(sum(logprobs) / len(logprobs)) if logprobs else None


def _finite_or_none(score: float | None) -> float | None:
    """A NaN or infinite score is no score (unparsable, counted), never passed on."""
    if score is None:
        return None
    value = float(score)
    return value if value == value and abs(value) != float("inf") else None
