"""The controller's admission server over a real loopback socket."""

from __future__ import annotations

import zmq

from streamrl.config import BufferConfig
from streamrl.controller.admission import AdmissionServer
from streamrl.controller.staleness import AdmissionPolicy
from streamrl.controller.state import GeneratorHealth, PromptLedger, RunState
from streamrl.protocol import (
    AdmissionReply,
    AdmissionRequest,
    GeneratorReport,
    Grant,
    ReplyParts,
)
from streamrl.transport import Codec, make_socket


def _ask(
    sock: zmq.Socket, codec: Codec, n: int, generator_id: int = 0, incarnation: int = 0
) -> ReplyParts:
    sock.send(codec.encode(AdmissionRequest(generator_id, n, incarnation)))
    assert sock.poll(5000), "no admission reply"
    return codec.decode(sock.recv()).parts()


def test_grants_pause_stop_and_live_knobs(ctx: zmq.Context) -> None:
    state = RunState()
    state.health[0] = GeneratorHealth()
    server = AdmissionServer(ctx, AdmissionPolicy(2, BufferConfig(max_staleness=0), state), state)
    sock = make_socket(ctx, zmq.DEALER)
    sock.connect(server.endpoint)
    codec: Codec[AdmissionReply] = Codec(AdmissionReply, "test")
    try:
        first = _ask(sock, codec, 5)
        assert (first.grant.granted, first.grant.min_version) == (2, 0)
        assert first.directives.temperature is None
        state.paused = True
        assert _ask(sock, codec, 1).grant.granted == 0
        state.paused, state.version = False, 1
        state.temperature, state.prompts_per_call = 0.7, 3
        live = _ask(sock, codec, 2)
        assert (live.grant.granted, live.grant.min_version, live.clock.learner_version) == (2, 1, 1)
        # Live generator knobs (PATCH /config) ride on every reply.
        assert (live.directives.temperature, live.directives.prompts_per_call) == (0.7, 3)
        state.stop = True
        assert _ask(sock, codec, 1).directives.stop
    finally:
        sock.close()
        server.close()


def test_prompts_return_when_a_generator_goes_and_stale_incarnations_get_nothing(
    ctx: zmq.Context,
) -> None:
    """Generator 1 is granted prompts 2 and 3, pushes one group, dies: prompt 3 and its
    budget come back, the next grant hands 3 out first; its old incarnation is told to leave."""
    state = RunState()
    state.health[0], state.health[1] = GeneratorHealth(), GeneratorHealth()
    server = AdmissionServer(ctx, AdmissionPolicy(2, BufferConfig(max_staleness=1), state), state)
    sock = make_socket(ctx, zmq.DEALER)
    sock.connect(server.endpoint)
    codec: Codec[AdmissionReply] = Codec(AdmissionReply, "test")
    try:
        assert _ask(sock, codec, 2, generator_id=0).grant.prompt_indices == [0, 1]
        assert _ask(sock, codec, 2, generator_id=1).grant.prompt_indices == [2, 3]
        # 4 in flight = (1 + 0 + 1) * 2
        assert _ask(sock, codec, 1, generator_id=0).grant.granted == 0
        state.generator_report(GeneratorReport(1, 0, 10, 1, 0, 0, 1.0))
        assert state.release_generator(1) == 1 and server.policy.in_flight() == 3
        state.health[1].incarnation = 1  # replaced
        old = _ask(sock, codec, 1, generator_id=1, incarnation=0)
        assert old.directives.retire and old.grant == Grant()
        again = _ask(sock, codec, 2, generator_id=1, incarnation=1)
        assert again.grant.prompt_indices == [3] and not again.directives.retire
        state.health[1].retiring = True
        assert _ask(sock, codec, 1, generator_id=1, incarnation=1).directives.retire
        assert _ask(sock, codec, 1, generator_id=7).grant.granted == 0  # an id nobody started
    finally:
        sock.close()
        server.close()


def test_prompt_ledger_snapshot_holds_every_unfinished_prompt() -> None:
    ledger = PromptLedger()
    ledger.grant(0, 3)  # 0, 1, 2
    ledger.grant(1, 2)  # 3, 4
    ledger.delivered(0, 2)  # 0 and 1 pushed
    ledger.release(1)
    assert ledger.snapshot() == {"next_index": 5, "retry": [2, 3, 4], "trained": {}}
    resumed = PromptLedger(**ledger.snapshot())
    assert resumed.grant(2, 4) == [2, 3, 4, 5]


def test_generated_tokens_per_s_spans_sparse_reports() -> None:
    """One report per 30 s call (sync mode) still gives a rate over the last two reports."""
    from streamrl.controller.intake import ReportIntake

    intake = ReportIntake(RunState(), max_steps=10, eval_every=0)
    for t, n in [(0.0, 0), (30.0, 900), (60.0, 1800)]:
        intake.token_samples.append((t, n))
    assert intake.tokens_per_s() == 30.0
    intake.token_samples.extend([(61.0, 1900), (62.0, 2000)])
    assert intake.tokens_per_s() == (2000 - 900) / (62.0 - 30.0)


def test_step_tokens_per_s_covers_the_whole_step() -> None:
    """A sync step: 20 s generating 600 tokens, then 25 s training. The rolling 10 s window
    sees only training (0 tokens/s); the step's figure is its rate over all 45 s."""
    from streamrl.controller.intake import ReportIntake
    from streamrl.protocol import GeneratorReport

    state = RunState()
    intake = ReportIntake(state, max_steps=10, eval_every=0)
    for t, n in [(0.0, 0), (10.0, 300), (20.0, 600), (35.0, 600), (44.0, 600)]:
        intake.token_samples.append((t, n))
    state.generators[0] = GeneratorReport(0, 0, 600, 8, 0, 0, 44.0)
    assert intake.tokens_per_s() == 0.0
    assert intake.step_tokens_per_s(45.0) == 600 / 45.0
    state.generators[0] = GeneratorReport(0, 1, 1500, 16, 0, 0, 80.0)
    assert intake.step_tokens_per_s(90.0) == 900 / 45.0
