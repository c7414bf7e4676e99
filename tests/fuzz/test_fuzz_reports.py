"""Fuzzing the controller's report PULL socket, through the controller's own code.

The socket is the one ``ReportIntake.open`` binds for the controller (PULL, rcvhwm unbounded)
and the reports are read by ``ReportIntake.drain``, the controller loop's own intake, with its
``Codec(Report)`` and the ``RunState`` methods each report becomes. Nothing here needs Ray or
a ``Controller``.

PULL reads frames, not messages: a multipart junk message is decoded frame by frame, so the
prediction counts frames.
"""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest
import zmq
from fuzzgen import Tally, classify, msgpack_corpus
from support import wait_until

from streamrl.clock import LearnerClock
from streamrl.controller.intake import ReportIntake
from streamrl.controller.state import GeneratorHealth, RunState
from streamrl.metrics import MetricsLog
from streamrl.protocol import (
    AdmissionRequest,
    BatchRequest,
    BatchTaken,
    EvalReport,
    GeneratorActivity,
    GeneratorReport,
    Heartbeat,
    LearnerStep,
    Report,
    ShardReport,
    ShardStats,
    WeightAnchor,
)
from streamrl.transport import make_socket

N_INPUTS = 10_000
SENTINEL = 987_654_321  # EvalReport.requested of the last message of a burst

pytestmark = pytest.mark.slow


def drain_until_sentinel(controller: ReportIntake, tally: Tally, timeout: float = 30.0) -> None:
    """Run the intake's drain until the sentinel report went through it; an exception out of
    ``drain`` (it would end the controller loop) counts as a crash."""

    def seen() -> bool:
        try:
            controller.drain(timeout_ms=50)
        except Exception:
            tally.crashes += 1
        return any(e.requested == SENTINEL for e in controller.evals[-2:])

    wait_until(seen, timeout, "the sentinel report")
    controller.evals = [e for e in controller.evals if e.requested != SENTINEL]


def test_reports_survive_fuzz_and_valid_reports_are_still_taken(tmp_path: Path) -> None:
    tally = Tally("reports")
    # max_steps high enough that junk versions below it leave room for a valid next step.
    metrics = MetricsLog(tmp_path / "metrics.jsonl")  # EvalReports write here
    state = RunState()
    controller = ReportIntake(
        state,
        max_steps=1_000_000_000,
        eval_every=0,
        on_eval=lambda e: metrics.eval(e.requested, e.version, e.metrics),
    )
    context = zmq.Context()
    endpoint = controller.open(context, "127.0.0.1")
    state.health[0] = GeneratorHealth()
    push = make_socket(context, zmq.PUSH)
    push.connect(endpoint)
    encode = msgspec.msgpack.encode
    try:
        seeds = [
            LearnerStep(3, {"loss/policy": 0.5, "reward/mean": 0.25}, 10.0),
            GeneratorReport(
                0, 2, 100, 4, 0, 1, 11.0, [1, 2], activity=GeneratorActivity(busy_s=1.0)
            ),
            ShardReport(
                ShardStats(0, 5, 256, 10, 5, {"stale": 1}, 1000, staleness_hist={0: 5}), 12.0
            ),
            EvalReport(0, 2, 2, {"eval/accuracy": 0.5, "eval/prompts": 8.0}, 13.0),
            Heartbeat("generator", 0, 0, 14.0),
            BatchTaken(1, 4, [8, 9]),
        ]
        other = [AdmissionRequest(0, 1), BatchRequest(1, 2, 0, 0), WeightAnchor(1, 0, 1, [], 1.0)]
        tags = ["learner_step", "generator_report", "shard_report", "eval_report", "heartbeat"]
        tags.append("batch_taken")
        rng = random.Random(13_002)
        inputs = msgpack_corpus(rng, seeds, N_INPUTS, other_kinds=other, tags=tags)
        frames = [f for item in inputs for f in (item if isinstance(item, list) else [item])]
        decoded, expected = classify(frames, msgspec.msgpack.Decoder(Report).decode)
        kinds = (LearnerStep, EvalReport, GeneratorReport, ShardReport, Heartbeat, BatchTaken)
        want = {kind: sum(isinstance(d, kind) for d in decoded) for kind in kinds}
        assert all(n > 20 for n in want.values()), want  # every kind of report got through

        for frame in frames:
            push.send(frame)
        tally.inputs += len(inputs)
        # Over MAX_REPORT_BYTES (4 MiB): libzmq refuses the frame and drops that peer's
        # connection, unread and uncounted; the other peers go on.
        big = make_socket(context, zmq.PUSH)
        big.connect(endpoint)
        big.send(b"\xc1" * (8 << 20))
        tally.inputs += 1
        push.send(encode(EvalReport(0, SENTINEL, 0, {}, 0.0)))
        drain_until_sentinel(controller, tally)
        big.close(linger=0)

        codec = controller.codec
        assert codec.malformed_total == sum(expected.values())
        assert codec.malformed["DecodeError"] == expected["DecodeError"]
        # A LearnerStep is taken when it comes from the current learner group (incarnation
        # 0 here) and moves the version forward, up to max_steps; the others are counted.
        taken, version, max_steps = 0, 0, controller.max_steps
        for d in decoded:
            if isinstance(d, LearnerStep) and d.incarnation == 0:
                if version < d.version <= max_steps:
                    taken, version = taken + 1, d.version
        assert 0 < taken < want[LearnerStep]
        assert len(controller.steps) == taken and state.version == version
        ignored = controller.ignored
        assert sum(n for k, n in ignored.items() if k.startswith("LearnerStep")) == (
            want[LearnerStep] - taken
        )
        # An evaluation is taken when it was of weights on the timeline: no learner restart
        # happens here, so of any epoch >= 0 (an epoch below 0 names no weights).
        clock = LearnerClock()
        live = [
            d
            for d in decoded
            if isinstance(d, EvalReport) and clock.on_timeline(d.weights_epoch, d.version)
        ]
        assert len(controller.evals) == len(live)
        off = ignored.get("EvalReport: of weights off the timeline", 0)
        assert off == want[EvalReport] - len(live)

        # Valid reports after the junk are taken exactly as before. (The junk's well-typed
        # LearnerSteps moved the run's version, but within max_steps.)
        poisoned = state.version
        with state.lock:
            incarnation = state.health[0].incarnation
        report = GeneratorReport(0, 5, 123, 7, 0, 1, 1e9, incarnation=incarnation)
        step = LearnerStep(poisoned + 1, {"loss/policy": 0.1}, 1e9 + 2)
        for message in (
            report,
            Heartbeat("generator", 0, incarnation, 1e9 + 1),
            step,
            EvalReport(0, SENTINEL, 0, {}, 0.0),
        ):
            push.send(encode(message))
        drain_until_sentinel(controller, tally)
        assert state.generators[0] == report
        assert state.last_seen["generator 0"] == 1e9 + 1
        assert controller.steps[-1] == step and state.version == poisoned + 1
        assert codec.malformed_total == sum(expected.values())
    finally:
        tally.report(
            {
                **{f"malformed/{k}": n for k, n in controller.codec.malformed.items()},
                "learner_steps": len(controller.steps),
                "evals": len(controller.evals),
                "generators_known": len(state.health),
                "run_version": state.version,
            }
        )
        push.close()
        controller.close()
        metrics.close()
        context.destroy(linger=0)
    assert tally.crashes == 0
