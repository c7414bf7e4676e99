"""Reward roles (docs/design.md §7c): one Ray actor per served reward, started before the
generators, restarted when it dies.

| seen                                         | done                                           |
|----------------------------------------------|------------------------------------------------|
| ``serve()`` ended with an error (kill -9)    | start it again on the same port; its epoch     |
|                                              | rises in admission replies, and generators     |
|                                              | send what was in flight to it again            |
| no heartbeat for ``run.heartbeat_timeout_s`` | kill it (SIGSTOP too), start it again as above |
| more restarts than ``run.max_restarts``      | the run fails with a line naming it            |
| the run stops                                | asked to stop after the generators left        |

A restart holds the controller's loop while the scorer loads (seconds for a small model); the
loop then drains the reports queued meanwhile, as after a learner restart.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from streamrl.config import Config
from streamrl.controller.context import RunContext
from streamrl.controller.roles import RoleId, RoleSlot
from streamrl.controller.rundir import RunError, last_line

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 600.0  # loading a reward model (a hub download included)


def resolve_scorer_models(config: Config) -> dict[int, str]:
    """Each served reward's model directory by its index, resolved (downloaded) once, before
    any process starts: a missing reward model fails the launch in one line."""
    from streamrl.models import resolve_model

    dirs = {}
    for index, reward in enumerate(config.rewards):
        if reward.served:
            dirs[index] = str(Path(resolve_model(reward.served_model)).resolve())
    return dirs


class RewardPool:
    def __init__(self, ctx: RunContext, model_dirs: dict[int, str]) -> None:
        self.ctx = ctx
        self.model_dirs = dict(model_dirs)
        self.ports: dict[int, int] = {}

    @property
    def slots(self) -> dict[int, RoleSlot]:
        return self.ctx.roles.of_kind("reward role")

    def launch_all(self) -> None:
        """Start every served reward's role (their scorers load meanwhile: ``await_ready``)."""
        for index in self.model_dirs:
            self._launch(index, incarnation=0)

    def await_ready(self) -> dict[int, str]:
        """Every launched role ready and serving; their endpoints by reward index."""
        return {index: self._ready(index, slot) for index, slot in self.slots.items()}

    def _launch(self, index: int, incarnation: int) -> RoleSlot:
        from streamrl.controller.actors import RewardRoleActor

        ctx = self.ctx
        spec = ctx.specs.reward_role(
            index, self.model_dirs[index], self.ports.get(index, 0), incarnation
        )
        actor = RewardRoleActor.options(**ctx.placement.options("scoring", index)).remote(spec)
        slot = RoleSlot(actor, pid_ref=actor.pid.remote())
        slot.incarnation = incarnation
        ctx.roles.put(RoleId.reward(index), slot)
        return slot

    def _ready(self, index: int, slot: RoleSlot) -> str:
        """Wait for the role's scorer to load; start its loop; its endpoint."""
        import ray

        label = self.ctx.config.rewards[index].display_name()
        try:
            endpoint = ray.get(slot.actor.endpoint.remote(), timeout=READY_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise RunError(
                f"reward role {index} ({label}): not ready in {READY_TIMEOUT_S:.0f} s"
            ) from None
        except ray.exceptions.RayError as exc:
            raise RunError(f"reward role {index} ({label}): {last_line(exc)}") from None
        self.ports[index] = int(endpoint.rsplit(":", 1)[1])
        slot.endpoints = (endpoint,)
        slot.run_ref = slot.actor.serve.remote()
        return endpoint

    def check(self) -> bool:
        """Restart every reward role whose loop ended with an error (module doc); whether
        one was restarted. Not while the run stops: a role failing then ends nothing."""
        import ray

        ctx, restarted = self.ctx, False
        if ctx.state.stop:
            return False
        now = time.time()
        for index, slot in list(self.slots.items()):
            if slot.run_ref is None:
                continue
            done, _ = ray.wait([slot.run_ref], timeout=0)
            if done:
                try:
                    ray.get(slot.run_ref)
                    failure = "exited early"
                except ray.exceptions.RayError as exc:
                    failure = last_line(exc)
            else:
                heard = ctx.state.last_seen.get(str(RoleId.reward(index)))
                silent_for = slot.silent_for(heard, now)
                if silent_for <= ctx.config.run.heartbeat_timeout_s:
                    continue
                failure = f"no heartbeat for {silent_for:.0f} s"
            self.restart(index, failure)
            restarted = True
        return restarted

    def restart(self, index: int, failure: str) -> None:
        ctx, role = self.ctx, RoleId.reward(index)
        restarts = ctx.count_restart(str(role), failure)
        ctx.roles.kill(role)
        ctx.roles.forget(role)
        with ctx.state.lock:  # not heard from yet: its grace starts when it is launched
            ctx.state.last_seen.pop(str(role), None)
        incarnation = restarts
        slot = self._launch(index, incarnation)
        self._ready(index, slot)
        with ctx.state.lock:  # after it is ready: generators resend to a role that listens
            ctx.state.scorer_epochs[index] = incarnation
        ctx.note(
            f"{role} ({ctx.config.rewards[index].display_name()}): {failure}; restarted "
            f"(restart {restarts}/{ctx.config.run.max_restarts})"
        )
        ctx.metrics.event("restart", role=str(role), failure=failure, restarts=restarts)

    def stop_all(self) -> None:
        """Ask every role to leave its loop (the generators have left)."""
        import ray

        refs = []
        for slot in self.slots.values():
            try:
                slot.actor.stop.remote()
                if slot.run_ref is not None:
                    refs.append(slot.run_ref)
            except ray.exceptions.RayError:
                pass
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=10)
