"""The generator's reporting: its figures to the controller, and a heartbeat from a thread.

Both go to the controller's report PULL socket (docs/design.md §5). ``Reporting.report`` sends
a ``GeneratorReport`` at most once a second unless forced (after a version is applied, after
every generation call, before leaving), without blocking: a controller that is behind loses
one, and the next carries the totals. An ``EvalReport`` is sent blocking: the controller waits
for it. The heartbeat starts first, before the model loads, so the supervisor (§6) hears the
process from the start and replaces one that goes silent.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import msgspec
import zmq

from streamrl.cores import side_thread
from streamrl.protocol import (
    EvalReport,
    GeneratorActivity,
    GeneratorReport,
    Heartbeat,
    ScoringFigures,
)
from streamrl.transport import make_socket
from streamrl.workers.progress import Progress

if TYPE_CHECKING:  # the parts a report reads; they never import this module's users
    from streamrl.workers.generation.generator_weights import GeneratorWeights
    from streamrl.workers.generation.sampling import Sampler


class HeartbeatThread:
    """A ``Heartbeat`` every ``every_s`` from a daemon thread with its own socket (ZeroMQ
    sockets are not thread-safe), carrying the main thread's ``progress``: the supervisor
    replaces a generator (or a reward role, ``role="reward role"``) that goes silent or
    stalls."""

    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str,
        index: int,
        incarnation: int,
        every_s: float = 1.0,
        role: str = "generator",
        progress: Progress | None = None,
    ) -> None:
        self.sock = make_socket(ctx, zmq.PUSH, sndhwm=4)
        self.sock.connect(endpoint)
        self.beat = Heartbeat(role, index, incarnation, 0.0)
        self.progress = progress if progress is not None else Progress()
        self.every_s = every_s
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="heartbeat")
        self.thread.start()

    def _run(self) -> None:
        side_thread()  # a beat is due on time even on a core the decode saturates
        encoder = msgspec.msgpack.Encoder()
        while not self._stop.is_set():
            self.beat.time = time.time()
            self.beat.progress = self.progress.steps
            self.beat.stalled_s = self.progress.stalled_s()
            with contextlib.suppress(zmq.Again):  # the controller is behind: skip this beat
                self.sock.send(encoder.encode(self.beat), zmq.NOBLOCK)
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=2)
        self.sock.close()


class Reporting:
    """The report socket, the heartbeat and the activity timers the reports carry.
    ``snapshot`` builds the current report from the generator's parts; it is called only when
    a report is sent."""

    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str,
        generator_id: int,
        incarnation: int,
        snapshot: Callable[[], GeneratorReport],
    ) -> None:
        # The generator's work: its decode steps, versions adopted, calls finished.
        self.progress = Progress()
        self.heartbeat = HeartbeatThread(
            ctx, endpoint, generator_id, incarnation, progress=self.progress
        )
        self.sock = make_socket(ctx, zmq.PUSH)
        self.sock.connect(endpoint)
        self.snapshot = snapshot
        self._encoder = msgspec.msgpack.Encoder()
        self._last_report = 0.0
        self.timers = GeneratorActivity()

    @contextlib.contextmanager
    def timing(self, activity: str) -> Iterator[None]:
        """Add the block's seconds to ``activity``'s timer, less the weight application inside
        it (``weights_pause_s`` has those)."""
        start, paused = time.perf_counter(), self.timers.weights_pause_s
        try:
            yield
        finally:
            spent = time.perf_counter() - start - (self.timers.weights_pause_s - paused)
            setattr(self.timers, activity, getattr(self.timers, activity) + spent)

    def report(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_report < 1.0:
            return
        self._last_report = now
        frame = self._encoder.encode(self.snapshot())
        try:
            self.sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:  # the controller is behind: the next report carries the totals
            pass

    def send_eval(self, report: EvalReport) -> None:
        self.sock.send(self._encoder.encode(report))  # blocking: the controller waits for it

    def close(self) -> None:
        self.heartbeat.stop()


def generator_report(
    generator_id: int,
    incarnation: int,
    weights: GeneratorWeights,
    sampler: Sampler,
    groups_pushed: int,
    timers: GeneratorActivity,
    scoring: ScoringFigures,
) -> GeneratorReport:
    """The generator's figures now, read from the parts that own them."""
    sub, episodes = weights.subscriber, sampler.episodes
    return GeneratorReport(
        generator_id=generator_id,
        applied_version=weights.engine.version,
        tokens_generated=sampler.tokens_generated,
        probe_tokens_passed_over=sampler.probe_tokens_passed_over,
        groups_guided=sampler.guidance.groups_guided,
        guidance_tokens_displaced=sampler.guidance.tokens_displaced,
        groups_settled_early=sampler.screening.groups_settled,
        samples_spared=sampler.screening.samples_saved,
        groups_pushed=groups_pushed,
        checksum_failures=sub.checksum_failures,
        anchors_applied=sub.anchors_applied,
        time=time.time(),
        verified_versions=list(sub.verified_versions[-100:]),
        anchors_requested=sub.anchors_requested,
        weights_bytes_received=sub.bytes_received,
        weights_apply_s=sub.last_apply_s,
        weights_latency_s=weights.last_latency_s,  # publish -> adopted by the engine
        weights_stages=weights.last_stages,
        images_verified=sub.images_verified,
        image_mismatches=sub.image_mismatches,
        reward_errors=sampler.rules_worker.figures.errors,
        reward_timeouts=sampler.rules_worker.figures.timeouts,
        rules_wait_s=sampler.rules_worker.figures.wait_s,
        weights_epoch=weights.held_epoch,
        activity=msgspec.structs.replace(timers),  # a copy: the timers go on
        incarnation=incarnation,
        episode_ends=dict(episodes.ends) if episodes else {},
        episode_errors=dict(episodes.errors) if episodes else {},
        outcome_indices=[index for index, _ in sampler.outcomes],
        outcome_flat=[flat for _, flat in sampler.outcomes],
        outcomes_total=sampler.outcomes_total,
        scoring=scoring,  # the delivery part's (``NoScoring``: all zero)
    )
