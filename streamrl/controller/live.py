"""The controller's side of the admin API: ``RunControl`` over the live run (issue: operating).

Every method runs on an HTTP worker thread. Shared state is guarded by ``state.lock`` (the
run's state: admission decisions, live generator knobs) and by ``self.lock`` (the config and
the shard control sockets, which only this class uses).

Live changes are all-or-nothing: buffer knobs go to every shard as one ``Reconfigure``; if a
shard refuses, the shards that accepted are set back and the patch answers 422.
Example: ``{"buffer.max_staleness": 0}`` -> admission uses 0 from its next decision, every
shard evicts with 0 from its next batch, and ``/status`` shows 0.

``LiveRun`` is given what it works on, by name: the run's config, its ``RunState``, the
admission policy, the learner actors, the run's live figures (``RunFigures``), a stop callback
and the checkpoint directory. It does not know the controller.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import msgspec
import zmq

from streamrl.config import Config, to_dict
from streamrl.controller.context import RunContext
from streamrl.controller.knobs import LIVE_KEYS, get_key, set_key
from streamrl.controller.records import episode_totals, run_yield, scoring_figures
from streamrl.controller.staleness import AdmissionPolicy
from streamrl.controller.state import RunState
from streamrl.protocol import Ack, Checkpoint, EvalReport, Reconfigure
from streamrl.transport import Codec, make_socket


class RunFigures(Protocol):
    """The running figures ``/status`` and ``/metrics`` read (the controller keeps them)."""

    last_record: dict[str, Any]  # the newest step record
    evals: list[EvalReport]

    def steps_per_s(self) -> float: ...

    def tokens_per_s(self) -> float: ...

    def role_health(self, now: float) -> dict[str, dict[str, Any]]: ...


class LiveRun:
    def __init__(
        self,
        *,
        config: Config,
        state: RunState,
        policy: AdmissionPolicy,
        learners: Callable[[], list[Any]],
        figures: RunFigures,
        request_stop: Callable[[], None],
        checkpoint_dir: Path,
        shard_endpoints: list[str],
    ) -> None:
        """``learners``: the current learner actors (a restart replaces them); each has
        ``set_live`` and ``request_checkpoint`` (Ray remote methods)."""
        # Not ``self.config``: ``config()`` is the ``RunControl`` method the admin API calls.
        self.run_config, self.state, self.policy = config, state, policy
        self.learners, self.figures = learners, figures
        self.request_stop, self.checkpoint_dir = request_stop, checkpoint_dir
        self.lock = threading.Lock()
        self.ctx = zmq.Context()
        self.shards = []
        for endpoint in shard_endpoints:
            sock = make_socket(self.ctx, zmq.DEALER)
            sock.connect(endpoint)
            self.shards.append(sock)
        self.codec: Codec[Ack] = Codec(Ack, "shard control")

    # ------------------------------------------------------------------ reads

    def config(self) -> dict[str, Any]:
        with self.lock:
            return to_dict(self.run_config)

    def status(self) -> dict[str, Any]:
        state, figures, policy = self.state, self.figures, self.policy
        now = time.time()
        hist: dict[str, int] = {}
        for stats in state.shards.values():
            for staleness, n in stats.staleness_hist.items():
                hist[str(staleness)] = hist.get(str(staleness), 0) + n
        return {
            "run": self.run_config.run.name,
            "mode": self.run_config.run.mode,
            "state": "stopping" if state.stop else "paused" if state.paused else "running",
            "version": state.version,
            "max_steps": self.run_config.run.max_steps,
            "steps_per_s": figures.steps_per_s(),
            "tokens_per_s": figures.tokens_per_s(),
            "roles": figures.role_health(now),
            "shards": [
                {
                    "shard_id": s.shard_id,
                    "size": s.size,
                    "capacity": s.capacity,
                    "dropped": s.dropped,
                    "ingested": s.ingested,
                    "consumed": s.consumed,
                    "invalid": s.invalid,
                }
                for s in sorted(state.shards.values(), key=lambda s: s.shard_id)
            ],
            "staleness_hist": hist,
            "generators": [
                {
                    "generator_id": g.generator_id,
                    "applied_version": g.applied_version,
                    "reward_errors": g.reward_errors,
                    "reward_timeouts": g.reward_timeouts,
                    "episode_ends": dict(g.episode_ends),
                    "episode_errors": dict(g.episode_errors),
                }
                for g in sorted(state.generators.values(), key=lambda g: g.generator_id)
            ],
            "episodes": episode_totals(state.all_generator_reports()),
            "scoring": scoring_figures(state),
            "generation": run_yield(state).summary(),
            "admission": {
                "started": policy.started,
                "dropped": policy.dropped,
                "max_staleness": policy.max_staleness,
            },
        }

    def metrics(self) -> dict[str, float]:
        figures = self.figures
        out = {k: v for k, v in figures.last_record.items() if isinstance(v, int | float)}
        out["version"] = self.state.version
        out["throughput/tokens_per_s"] = figures.tokens_per_s()
        if figures.evals:  # the newest held-out evaluation
            out.update({k: float(v) for k, v in figures.evals[-1].metrics.items()})
        return out

    # ------------------------------------------------------------------ writes

    def apply_live(self, changes: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        """Apply a validated patch; each key reaches the roles its row names (``knobs``)."""
        rows = [LIVE_KEYS[key] for key in changes]
        with self.lock:
            config, state = self.run_config, self.state
            old = {key: get_key(config, key) for key in changes}
            to_shards = {row.field: changes[row.key] for row in rows if "shards" in row.reaches}
            if to_shards:
                previous = {row.field: old[row.key] for row in rows if "shards" in row.reaches}
                self._reconfigure_shards(to_shards, previous)
            with state.lock:
                for row in rows:
                    value = changes[row.key]
                    # The supervisor and the admission policy read the config.
                    set_key(config, row.key, value)
                    if "generators" in row.reaches:
                        # Rides on AdmissionReply.directives.<field>.
                        setattr(state, row.field, value)
            for row in rows:
                if "learners" in row.reaches:
                    for learner in self.learners():
                        learner.set_live.remote(row.key, changes[row.key])
            return {key: (old[key], changes[key]) for key in changes}

    def _reconfigure_shards(self, changes: dict[str, Any], previous: dict[str, Any]) -> None:
        accepted = []
        for i, sock in enumerate(self.shards):
            ack = self._ask(sock, Reconfigure(**changes))
            if not ack.ok:
                for j in accepted:  # all or nothing: put the others back
                    self._ask(self.shards[j], Reconfigure(**previous))
                raise ValueError(f"buffer shard {i} refused: {ack.error}")
            accepted.append(i)

    def _ask(
        self, sock: zmq.Socket, message: Reconfigure | Checkpoint, timeout_s: float = 10.0
    ) -> Ack:
        sock.send(msgspec.msgpack.encode(message))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if sock.poll(100):
                reply = self.codec.decode(sock.recv())
                if reply is not None:
                    return reply
        raise RuntimeError(f"a buffer shard did not answer {type(message).__name__} in time")

    def pause(self) -> None:
        with self.state.lock:
            self.state.paused = True

    def resume(self) -> None:
        with self.state.lock:
            self.state.paused = False

    def stop(self) -> None:
        self.request_stop()

    def checkpoint(self) -> dict[str, Any]:
        """Ask every learner rank to save at the end of its current step (asynchronous), and
        every buffer shard to compact its durable log now (what a resume recovers from)."""
        for learner in self.learners():
            learner.request_checkpoint.remote()
        with self.lock:
            for i, sock in enumerate(self.shards):
                ack = self._ask(sock, Checkpoint(), timeout_s=60.0)
                if not ack.ok:
                    raise RuntimeError(f"buffer shard {i} could not compact: {ack.error}")
        version = self.state.version
        return {
            "requested": True,
            "expected_version": version + 1,
            "directory": str(self.checkpoint_dir),
        }

    def close(self) -> None:
        self.ctx.destroy(linger=0)


def start_live_admin(
    ctx: RunContext, figures: RunFigures, request_stop: Callable[[], None]
) -> tuple[LiveRun, Any]:
    """The run's admin view and its HTTP server (``admin.server``); prints where it is."""
    from streamrl.admin.server import start_admin

    live = LiveRun(
        config=ctx.config,
        state=ctx.state,
        policy=ctx.policy,
        learners=lambda: ctx.roles.actors("learner rank"),
        figures=figures,
        request_stop=request_stop,
        checkpoint_dir=ctx.run_dir / "checkpoints",
        shard_endpoints=[req for _, req in ctx.specs.shard_endpoints],
    )
    admin = start_admin(
        live,
        ctx.config.admin,
        ctx.run_dir,
        on_event=lambda kind, fields: ctx.metrics.event(kind, **fields),
    )
    token = ctx.run_dir / "admin.token"
    print(f"admin: {admin.url} (token in {token})", file=ctx.console, flush=True)
    return live, admin
