"""The controller's run state and its admission server (DESIGN.md §3).

Generators ask the controller, over one ROUTER socket served by a thread, before they start
prompt groups; the policy (``staleness.AdmissionPolicy``) is the one global count of groups
started. Pause and stop close admission; live generator knobs ride on the replies.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import zmq

from streamrl.controller.staleness import AdmissionPolicy, Grant
from streamrl.protocol import AdmissionReply, AdmissionRequest, GeneratorReport
from streamrl.transport import Codec, bind_random, make_socket

log = logging.getLogger(__name__)


@dataclass
class RunState:
    """What the controller knows; updated from reports, read by admission and the admin API."""

    version: int = 0
    stop: bool = False
    paused: bool = False
    generators: dict[int, GeneratorReport] = field(default_factory=dict)
    shards: dict[int, Any] = field(default_factory=dict)
    # Live generator knobs set through the admin API; None = the generators' own config.
    temperature: float | None = None
    prompts_per_call: int | None = None
    last_seen: dict[str, float] = field(default_factory=dict)  # role -> last report time
    # Held-out evaluation: the newest version asked for, and the newest answered (-1: none).
    eval_requested: int = -1
    eval_answered: int = -1

    def current_version(self) -> int:
        return self.version

    def buffer_dropped(self) -> int:
        """Groups every shard dropped so far, all reasons (their admission budget returns)."""
        return sum(sum(s.dropped.values()) for s in self.shards.values())


class AdmissionServer:
    """Answers generators' ``AdmissionRequest``s from one thread (DESIGN.md §3)."""

    def __init__(self, ctx: zmq.Context, policy: AdmissionPolicy, state: RunState) -> None:
        self.policy, self.state = policy, state
        self.lock = threading.Lock()
        self.sock = make_socket(ctx, zmq.ROUTER)
        self.endpoint = bind_random(self.sock, role="controller admission")
        self.codec: Codec[AdmissionRequest] = Codec(AdmissionRequest, "admission")
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True, name="admission")
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.sock.poll(100):
                continue
            frames = self.sock.recv_multipart()
            request = self.codec.decode(frames[-1]) if len(frames) == 2 else None
            if request is None:
                continue
            try:
                reply = self._decide(request)
            except Exception:  # never let one bad decision kill admission for everyone
                log.exception("admission failed for %s", request)
                continue
            self.sock.send_multipart([frames[0], self.codec.encode(reply)])

    def _decide(self, request: AdmissionRequest) -> AdmissionReply:
        with self.lock:
            closed = self.state.stop or self.state.paused
            grant = Grant(0, 0) if closed else self.policy.request(request.n_groups)
            return AdmissionReply(
                granted=grant.granted,
                min_version=grant.min_version,
                learner_version=self.state.version,
                max_staleness=self.policy.max_staleness,
                stop=self.state.stop,
                temperature=self.state.temperature,
                prompts_per_call=self.state.prompts_per_call,
                eval_version=self._eval_for(request.generator_id),
            )

    def _eval_for(self, generator_id: int) -> int:
        """Generator 0 evaluates (between its calls); the others are never asked."""
        state = self.state
        pending = state.eval_requested > state.eval_answered
        return state.eval_requested if generator_id == 0 and pending else -1

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=2)
        self.sock.close()
