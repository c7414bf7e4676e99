"""Report intake: every role's reports, each turned into one ``RunState`` change.

The controller binds one PULL socket (``open``); every role PUSHes its reports there
(``protocol.Report``). ``drain`` decodes what arrived (bad frames are counted by kind, never
raised) and applies each report:

| report          | becomes                                                            |
|-----------------|--------------------------------------------------------------------|
| ``LearnerStep`` | ``state.learner_stepped`` (if from the current group and in range)  |
| ``BatchTaken``  | ``state.batch_taken`` (same check)                                  |
| ``GeneratorReport`` | ``state.generator_report`` (a replaced incarnation's: ignored)  |
| ``Heartbeat``   | ``state.heartbeat``                                                 |
| ``EvalReport``  | ``state.eval_answered`` and the metrics log                         |
| ``ShardReport`` | ``state.shard_report``                                              |

It also owns the rate windows the console, the metrics and the admin API read: generated
tokens per second and steps per second.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Any

import zmq

from streamrl.controller.state import RunState
from streamrl.protocol import (
    BatchTaken,
    EvalReport,
    GeneratorReport,
    Heartbeat,
    LearnerStep,
    Report,
    RewardRoleReport,
    ShardReport,
)
from streamrl.transport import Codec, bind_random, make_socket

log = logging.getLogger("streamrl")
# Reports are a few KiB; a shard's grows by ~30 bytes per generator process it heard from.
MAX_REPORT_BYTES = 1 << 22


class ReportIntake:
    def __init__(
        self,
        state: RunState,
        max_steps: int,
        eval_every: int,
        on_eval: Callable[[EvalReport], None] = lambda report: None,
        role_health: Callable[[float], dict[str, dict[str, Any]]] = lambda now: {},
    ) -> None:
        """``on_eval``: called with each evaluation taken (the metrics log writes it).
        ``role_health``: every role's health now (``Roles.health``), for the admin API,
        which reads its figures here (``live.RunFigures``)."""
        self.state, self.max_steps, self.eval_every = state, max_steps, eval_every
        self.on_eval, self.role_health = on_eval, role_health
        self.last_record: dict[str, Any] = {}  # the newest line of metrics.jsonl
        self.codec: Codec[Report] = Codec(Report, "reports")
        self.sock: zmq.Socket | None = None
        self.endpoint = ""
        self.ignored: dict[str, int] = {}  # learner reports not taken, by why
        self.evals: list[EvalReport] = []
        self.steps: list[LearnerStep] = []  # taken since the controller last recorded them
        self.step_times: list[float] = []
        self.token_samples: collections.deque = collections.deque(maxlen=4096)
        self._last_step_tokens: tuple[float, int] | None = None  # (time, generated tokens)

    def open(self, ctx: zmq.Context, host: str) -> str:
        # libzmq drops a peer that sends a bigger frame than MAX_REPORT_BYTES.
        self.sock = make_socket(ctx, zmq.PULL, rcvhwm=0, maxmsgsize=MAX_REPORT_BYTES)
        self.endpoint = bind_random(self.sock, host, "controller reports")
        return self.endpoint

    def drain(self, timeout_ms: int) -> None:
        """Apply every report that arrives within ``timeout_ms`` (then those queued)."""
        assert self.sock is not None
        if not self.sock.poll(timeout_ms):
            return
        while True:
            try:
                frame = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            report = self.codec.decode(frame)
            if report is not None:
                self.apply(report)

    def apply(self, report: Any) -> None:
        state = self.state
        match report:
            case LearnerStep() as step:
                if self.current_learner_report(step):
                    state.learner_stepped(step, self.eval_every, self.max_steps)
                    self.step_times.append(step.time)
                    self.steps.append(step)
            case BatchTaken() as taken:
                if self.current_learner_report(taken):
                    state.batch_taken(taken)
            case GeneratorReport() as g:
                if state.generator_report(g):  # else from a replaced incarnation
                    total = sum(r.tokens_generated for r in state.all_generator_reports())
                    self.token_samples.append((g.time, total))
            case Heartbeat() as beat:
                state.heartbeat(beat)
            case EvalReport() as evaluation:
                with state.lock:
                    live = state.eval_is_live(evaluation)
                    if live:
                        state.eval_answer(evaluation.requested)
                if not live:  # weights a learner restart took back: asked again on live ones
                    self._ignore(evaluation, "of weights off the timeline", "")
                    return
                self.evals.append(evaluation)
                self.on_eval(evaluation)
            case ShardReport() as shard:
                state.shard_report(shard)
            case RewardRoleReport() as scorer:
                state.reward_role_report(scorer)

    def current_learner_report(self, report: LearnerStep | BatchTaken) -> bool:
        """Whether ``report`` comes from the current learner group and names a version it can
        reach; others (a replaced group's late reports, versions out of range) are counted in
        ``ignored`` and logged once per kind."""
        state = self.state
        lowest = state.version + 1 if isinstance(report, LearnerStep) else 1
        if report.incarnation != state.weights_epoch:
            why, detail = "from a replaced learner group", ""
        elif not lowest <= report.version <= self.max_steps:
            why, detail = "version out of range", f" [{lowest}, {self.max_steps}]"
        else:
            return True
        self._ignore(report, why, detail)
        return False

    def _ignore(self, report: LearnerStep | BatchTaken | EvalReport, why: str, detail: str) -> None:
        """Count a report not taken in ``ignored``, by kind; log each kind once."""
        name = type(report).__name__
        kind = f"{name}: {why}"
        if kind not in self.ignored:
            log.warning("ignored a %s %s%s (version %d)", name, why, detail, report.version)
        self.ignored[kind] = self.ignored.get(kind, 0) + 1

    def take_steps(self) -> list[LearnerStep]:
        steps, self.steps = self.steps, []
        return steps

    # ------------------------------------------------------------------ rates

    def steps_per_s(self, window: int = 10) -> float:
        times = self.step_times[-window:]
        if len(times) > 1 and times[-1] > times[0]:
            return (len(times) - 1) / (times[-1] - times[0])
        return 0.0

    def tokens_per_s(self, window_s: float = 10.0) -> float:
        """Generated tokens per second over at least the last ``window_s`` of generator
        reports: from the newest report at or before the window's start (a generator that
        reports once per 30 s call still gets a rate, not 0)."""
        samples = self.token_samples
        if len(samples) < 2:
            return 0.0
        end_t, end_n = samples[-1]
        before = [(t, n) for t, n in samples if t <= end_t - window_s]
        start_t, start_n = before[-1] if before else samples[0]
        if end_t - start_t < 0.2:  # too short a span to be a rate
            return 0.0
        return (end_n - start_n) / max(end_t - start_t, 1e-6)

    def step_tokens_per_s(self, now: float) -> float:
        """Generated tokens per second since the previous step record was written (since the
        first generator report, for step 1). Unlike the rolling ``tokens_per_s``, a sync step
        whose training alone outlasts the window still shows the rate its generation ran at."""
        total = sum(g.tokens_generated for g in self.state.all_generator_reports())
        if self._last_step_tokens is None:
            self._last_step_tokens = self.token_samples[0] if self.token_samples else (now, 0)
        start_t, start_n = self._last_step_tokens
        self._last_step_tokens = (now, total)
        return (total - start_n) / (now - start_t) if now > start_t else 0.0

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=0)
