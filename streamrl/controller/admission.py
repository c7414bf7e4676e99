"""The controller's admission server (docs/design.md, admission).

Generators ask the controller, over one ROUTER socket served by a thread, before they start
prompt groups; the policy (``staleness.AdmissionPolicy``) is the one global count of groups
started. Pause and stop close admission. A reply has four parts (``protocol.AdmissionReply``):
the grant, the directives (stop, retire, evaluate, live generator knobs), the learner clock and
the asking generator's delivery receipts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import zmq

from streamrl.buffers.delivery import shard_sender
from streamrl.controller.staleness import AdmissionPolicy
from streamrl.controller.state import RunState
from streamrl.protocol import (
    AdmissionReply,
    AdmissionRequest,
    Directives,
    Grant,
    LearnerClockInfo,
    Receipts,
)
from streamrl.transport import LOOPBACK, Codec, bind_random, make_socket

log = logging.getLogger(__name__)

# An ``AdmissionRequest`` is a few dozen bytes; libzmq drops a peer that sends a bigger frame.
MAX_REQUEST_BYTES = 1 << 16


class AdmissionServer:
    """Answers generators' ``AdmissionRequest``s from one thread (docs/design.md §3)."""

    def __init__(
        self,
        ctx: zmq.Context,
        policy: AdmissionPolicy,
        state: RunState,
        host: str = LOOPBACK,
        evaluates_in_order: bool = False,
        probe_candidates: int = 1,
    ) -> None:
        """``evaluates_in_order``: generator 0 hands evaluations to its own process, which
        answers each version asked in turn (``eval.runs_on``): ask the oldest due.
        ``probe_candidates``: prompts offered per granted group (``generator.probe_candidates``;
        1: the granted ones alone)."""
        self.policy, self.state = policy, state
        self.probe_candidates = probe_candidates
        self._evaluates_in_order = evaluates_in_order
        state.policy = policy
        self.sock = make_socket(ctx, zmq.ROUTER, maxmsgsize=MAX_REQUEST_BYTES)
        self.endpoint = bind_random(self.sock, host, "controller admission")
        # Bad input is counted by kind in ``codec.malformed`` (``frames``: not one body).
        self.codec: Codec[AdmissionRequest] = Codec(AdmissionRequest, "admission")
        self.failures = 0  # requests that decoded but could not be answered (logged)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True, name="admission")
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.sock.poll(100):
                continue
            routed = self.codec.decode_routed(self.sock.recv_multipart())
            if routed is None:
                continue
            identity, request = routed
            try:
                # Encoding too: a reply can carry a value set over the admin API that does not
                # fit msgpack (an int over 64 bits); it must not end the thread.
                reply = self.codec.encode(self._decide(request))
            except Exception:  # never let one bad decision kill admission for everyone
                self.failures += 1
                log.exception("admission failed for %s", request)
                continue
            self.sock.send_multipart([identity, reply])

    def _decide(self, request: AdmissionRequest) -> AdmissionReply:
        state = self.state
        with state.lock:
            health = state.health.get(request.generator_id)
            # A generator being retired, or a replaced one's predecessor, gets nothing more.
            leaving = health is None or health.retiring or request.incarnation != health.incarnation
            closed = state.stop or state.paused or leaving
            if not leaving and request.sender:  # whose groups the shards' receipts name
                health.sender = request.sender
            return AdmissionReply(
                grant=Grant() if closed else self._grant(request),
                directives=Directives(
                    stop=state.stop,
                    retire=leaving,
                    eval_version=self._eval_for(request.generator_id),
                    eval_epoch=self.state.weights_epoch,
                    temperature=state.temperature,
                    prompts_per_call=state.prompts_per_call,
                ),
                clock=LearnerClockInfo(
                    learner_version=state.version,
                    weights_epoch=state.weights_epoch,
                ),
                receipts=Receipts(
                    delivered=_receipts(state, request.sender),
                    shard_epochs=dict(state.shard_epochs),
                    scorer_epochs=dict(state.scorer_epochs),
                    scorer_endpoints=dict(state.scorer_endpoints),
                ),
            )

    def _grant(self, request: AdmissionRequest) -> Grant:
        """The policy's grant and the prompts for it (call under ``state.lock``)."""
        decision = self.policy.request(request.n_groups)
        if not decision.granted:  # nothing recorded: the ledger must not grow an entry per ask
            return Grant(0, decision.min_version)
        prompts, keep = self.state.prompts, self._keep()
        indices = prompts.grant(request.generator_id, decision.granted, keep)
        # Probe sampling: fresh candidates beside them (``Grant.candidates``).
        candidates = prompts.draw(decision.granted * (self.probe_candidates - 1), keep)
        return Grant(decision.granted, decision.min_version, indices, candidates)

    def _keep(self) -> Callable[[int], bool] | None:
        """The difficulty sampler's choice of fresh prompts (None: every one is asked)."""
        return self.state.difficulty.keep if self.state.difficulty is not None else None

    def _eval_for(self, generator_id: int) -> int:
        """Generator 0 evaluates (or its evaluation process); the others are never asked."""
        if generator_id != 0:
            return -1
        return self.state.eval_to_ask(in_order=self._evaluates_in_order)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=2)
        self.sock.close()


def _receipts(state: RunState, sender: str) -> dict[int, int]:
    """Per shard, the floor of ``sender``'s groups it has (from its newest stats)."""
    if not sender:
        return {}
    receipts = {}
    for shard_id, stats in state.shards.items():
        floor = stats.delivered.get(shard_sender(sender, shard_id))
        if floor is not None:
            receipts[shard_id] = floor
    return receipts
