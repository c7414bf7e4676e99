"""Reward roles (docs/design.md §7c): one Ray actor per served reward, started before the
generators, restarted when it dies.

| seen                                         | done                                           |
|----------------------------------------------|------------------------------------------------|
| ``serve()`` ended with an error (kill -9)    | start it again (on the same port if free); its |
|                                              | epoch and endpoint go out in admission replies,|
|                                              | and generators send what was in flight to it   |
|                                              | again (reconnecting if it moved)               |
| it died (either way) scoring a batch         | the batch's requests are suspects: scored alone|
|                                              | by the next; refused after a second death      |
| its scorer fails to load on a restart        | try again after a backoff (1 s, doubling to    |
|                                              | 30 s), each try a restart                      |
| no heartbeat for ``run.heartbeat_timeout_s`` | kill it (SIGSTOP too), start it again as above |
| no progress for ``run.stall_timeout_s`` with | kill it, start it again as above               |
| requests in hand (a wedged forward)          |                                                |
| more restarts than ``run.max_restarts``      | the run fails with a line naming it            |
| the run stops                                | asked to stop after the generators left        |

A restart holds the controller's loop while the scorer loads (seconds for a small model); the
loop then drains the reports queued meanwhile, as after a learner restart.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import msgspec

from streamrl.config import Config
from streamrl.controller.context import RunContext
from streamrl.controller.roles import RoleId, RoleSlot
from streamrl.controller.rundir import RunError, last_line
from streamrl.role_specs import QUARANTINE_AFTER, RewardRoleSpec

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 600.0  # loading a reward model (a hub download included)
# A restarted role whose scorer fails to load is tried again after this, doubling up to the
# cap (a node short of memory a moment, a file system catching up), within run.max_restarts.
RELOAD_BACKOFF_S = 1.0
MAX_RELOAD_BACKOFF_S = 30.0


def resolve_scorer_models(config: Config, policy_dir: Path) -> dict[int, str]:
    """Each served reward's model directory by its index, resolved (downloaded) once, before
    any process starts: a missing reward model fails the launch in one line. A lagged
    teacher (``teacher.model: self``) starts from the policy's own directory."""
    from streamrl.models import resolve_model

    dirs = {}
    for index, reward in enumerate(config.rewards):
        if reward.lagged_teacher:
            dirs[index] = str(Path(policy_dir).resolve())
        elif reward.served:
            dirs[index] = str(Path(resolve_model(reward.served_model)).resolve())
    return dirs


class RewardPool:
    """The run's reward roles: launched, watched (``check``), restarted (``restart``).

    Invariant: a request that ``QUARANTINE_AFTER`` incarnations of a role died scoring (the
    ids in their last report's ``scoring_ids``) is refused by the next, never resent until
    ``run.max_restarts`` ends the run; a failed reload is one more restart, tried again
    after a backoff.

    Example: incarnation 0 dies scoring [g-3, g-4]: incarnation 1 is told {g-3: 1, g-4: 1}
    and scores each alone; it dies on g-4: incarnation 2 is told {g-3: 1, g-4: 2} and
    answers g-4 with "quarantined" (its group refused, counted) and scores g-3."""

    def __init__(self, ctx: RunContext, model_dirs: dict[int, str]) -> None:
        self.ctx = ctx
        self.model_dirs = dict(model_dirs)
        self.ports: dict[int, int] = {}
        # Per reward index: request id -> incarnations that died scoring it.
        self.suspects: dict[int, dict[str, int]] = {}

    @property
    def slots(self) -> dict[int, RoleSlot]:
        return self.ctx.roles.of_kind("reward role")

    def launch_all(self) -> None:
        """Start every served reward's role but the lagged teachers' (their scorers load
        meanwhile: ``await_ready``)."""
        for index in self.model_dirs:
            if not self.ctx.config.rewards[index].lagged_teacher:
                self._launch(index, incarnation=0)

    def launch_followers(self) -> None:
        """Start the lagged teachers' roles: after the learners, whose weight endpoints their
        specs carry."""
        for index in self.model_dirs:
            if self.ctx.config.rewards[index].lagged_teacher:
                self._launch(index, incarnation=0)

    def await_ready(self) -> dict[int, str]:
        """Every launched role ready and serving; their endpoints by reward index."""
        return {index: self._ready(index, slot) for index, slot in self.slots.items()}

    def _launch(self, index: int, incarnation: int) -> RoleSlot:
        from streamrl.controller.actors import RewardRoleActor

        ctx = self.ctx
        spec = self._spec(index, incarnation)
        actor = RewardRoleActor.options(**ctx.placement.options("scoring", index)).remote(spec)
        slot = RoleSlot(actor, pid_ref=actor.pid.remote())
        slot.incarnation = incarnation
        ctx.roles.put(RoleId.reward(index), slot)
        return slot

    def _spec(self, index: int, incarnation: int) -> RewardRoleSpec:
        """The role's spec: its predecessor's port (0 at first), and the requests its
        predecessors died scoring."""
        spec = self.ctx.specs.reward_role(
            index, self.model_dirs[index], self.ports.get(index, 0), incarnation
        )
        return msgspec.structs.replace(spec, suspects=dict(self.suspects.get(index, {})))

    def _ready(self, index: int, slot: RoleSlot) -> str:
        """Wait for the role's scorer to load; start its loop; its endpoint."""
        endpoint = self._await_endpoint(index, slot)
        self.ports[index] = int(endpoint.rsplit(":", 1)[1])
        slot.endpoints = (endpoint,)
        slot.run_ref = slot.actor.serve.remote()
        with self.ctx.state.lock:
            self.ctx.state.scorer_endpoints[index] = endpoint
        return endpoint

    def _await_endpoint(self, index: int, slot: RoleSlot) -> str:
        """The role's endpoint once its scorer loaded; a RunError if it failed to."""
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
                unresponsive = ctx.roles.unresponsive(
                    RoleId.reward(index), ctx.state, now, ctx.config.run
                )
                if unresponsive is None:
                    continue
                failure = unresponsive
            self.restart(index, failure)
            restarted = True
        return restarted

    def restart(self, index: int, failure: str) -> None:
        """Start the role again (class doc); a reload that fails is retried after a backoff,
        each try one more restart, until ``run.max_restarts`` ends the run."""
        ctx, role = self.ctx, RoleId.reward(index)
        self._suspect(index)
        restarts = ctx.count_restart(str(role), failure)
        backoff = RELOAD_BACKOFF_S
        while True:
            ctx.roles.kill(role)
            ctx.roles.forget(role)
            ctx.state.not_heard(str(role))  # its grace starts when it is launched
            incarnation = restarts
            try:
                self._ready(index, self._launch(index, incarnation))
                break
            except RunError as exc:  # its scorer did not load: a restart too, after a pause
                log.warning("%s: reload failed (%s); again in %.0f s", role, exc, backoff)
                time.sleep(backoff)
                backoff = min(2 * backoff, MAX_RELOAD_BACKOFF_S)
                failure = f"reload failed: {exc}"
                restarts = ctx.count_restart(str(role), failure)
        with ctx.state.lock:  # after it is ready: generators resend to a role that listens
            ctx.state.scorer_epochs[index] = incarnation
        ctx.note(
            f"{role} ({ctx.config.rewards[index].display_name()}): {failure}; restarted "
            f"(restart {restarts}/{ctx.config.run.max_restarts})"
        )
        ctx.metrics.event("restart", role=str(role), failure=failure, restarts=restarts)

    def _suspect(self, index: int) -> None:
        """The role died: the requests its last report says it was scoring are suspects
        (``RewardRoleSpec.suspects``), once more each. Only a report of the incarnation that
        died counts (one that died before its first report blames nobody)."""
        slot = self.slots.get(index)
        with self.ctx.state.lock:
            report = self.ctx.state.reward_roles.get(index)
        ids = []
        if report is not None and slot is not None and report.incarnation == slot.incarnation:
            ids = list(report.scoring_ids)
        suspects = self.suspects.setdefault(index, {})
        for request_id in ids:
            suspects[request_id] = suspects.get(request_id, 0) + 1
        if ids:
            log.warning(
                "reward role %d died scoring %d request(s); %d now quarantined",
                index,
                len(ids),
                sum(n >= QUARANTINE_AFTER for n in suspects.values()),
            )

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
