"""The controller's admission server over a real loopback socket."""

from __future__ import annotations

import zmq

from streamrl.admission import AdmissionServer, RunState
from streamrl.protocol import AdmissionReply, AdmissionRequest
from streamrl.staleness import AdmissionPolicy
from streamrl.transport import Codec, make_socket


def _ask(sock: zmq.Socket, codec: Codec, n: int) -> AdmissionReply:
    sock.send(codec.encode(AdmissionRequest(0, n)))
    assert sock.poll(5000), "no admission reply"
    return codec.decode(sock.recv())


def test_grants_pause_stop_and_live_knobs(ctx: zmq.Context) -> None:
    state = RunState()
    server = AdmissionServer(ctx, AdmissionPolicy(2, 0, state), state)
    sock = make_socket(ctx, zmq.DEALER)
    sock.connect(server.endpoint)
    codec: Codec[AdmissionReply] = Codec(AdmissionReply, "test")
    try:
        first = _ask(sock, codec, 5)
        assert (first.granted, first.min_version, first.temperature) == (2, 0, None)
        state.paused = True
        assert _ask(sock, codec, 1).granted == 0
        state.paused, state.version = False, 1
        state.temperature, state.prompts_per_call = 0.7, 3
        live = _ask(sock, codec, 2)
        assert (live.granted, live.min_version) == (2, 1)
        # Live generator knobs (PATCH /config) ride on every reply.
        assert (live.temperature, live.prompts_per_call) == (0.7, 3)
        state.stop = True
        assert _ask(sock, codec, 1).stop
    finally:
        sock.close()
        server.close()


def test_generated_tokens_per_s_spans_sparse_reports() -> None:
    """One report per 30 s call (sync mode) still gives a rate over the last two reports."""
    import io

    from streamrl.config import load_config
    from streamrl.launch import Controller

    controller = Controller(load_config(None, []), console=io.StringIO())
    try:
        for t, n in [(0.0, 0), (30.0, 900), (60.0, 1800)]:
            controller._token_samples.append((t, n))
        assert controller.tokens_per_s() == 30.0
        controller._token_samples.extend([(61.0, 1900), (62.0, 2000)])
        assert controller.tokens_per_s() == (2000 - 900) / (62.0 - 30.0)
    finally:
        controller.ctx.destroy(linger=0)
