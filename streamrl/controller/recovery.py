"""Starting buffer shards and the learner group, and restarting them when one dies.

| seen                          | done                                                        |
|-------------------------------|-------------------------------------------------------------|
| a buffer shard's loop failed  | a new process on its durable log and its ports; generators  |
|                               | resend what it had not logged (``shard_epochs`` rises)      |
| a learner rank's loop failed  | the whole group (the others hang in a collective) starts    |
|                               | again from the newest checkpoint, in a new epoch            |

A learner-group restart follows the clock's rule (``streamrl.clock``, docs/design.md §6): the
new group resumes at the checkpoint's version ``v`` with epoch ``e + 1`` and fork ``v``. The
shards hear the new epoch first (``BufferClient.announce``): they follow the version down,
drop groups sampled on the dead timeline and cancel the dead group's parked takes, so no take
happens after. Then their take receipts say exactly which groups the lost steps took: those
return to the budget and their prompts are handed out again, once each.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from streamrl import checkpoint_layout
from streamrl.controller.context import RunContext
from streamrl.controller.roles import RoleId, RoleSlot
from streamrl.controller.rundir import RunError, last_line

log = logging.getLogger("streamrl")
T = TypeVar("T")
# How long a restart keeps trying when the new process dies before it runs: Ray may place it
# on a node that died moments ago and that its health checks (about 15 s) still call alive.
START_RETRY_S = 60.0
# How long a learner restart waits for every shard to hear the new epoch (restarting dead ones).
ANNOUNCE_S = 60.0


def endpoint_ports(endpoints: tuple[str, ...] | list[str]) -> tuple[int, int]:
    """The two ports of a role's endpoint pair (``tcp://host:port``), to bind again."""
    first, second = (int(endpoint.rsplit(":", 1)[1]) for endpoint in endpoints)
    return first, second


def start_shard(ctx: RunContext, shard_id: int, ports: tuple[int, int] = (0, 0)) -> RoleSlot:
    """A shard process, bound and serving; its slot (in ``ctx.roles``)."""
    import ray

    from streamrl.controller.actors import BufferShardActor

    actor = BufferShardActor.options(**ctx.placement.options("buffer", 0)).remote(
        ctx.specs.shard(shard_id, ports)
    )
    try:
        endpoints = tuple(ray.get(actor.endpoints.remote()))
    except ray.exceptions.RayError:
        _kill_quietly([actor])  # never registered: nothing else would end it
        raise
    slot = RoleSlot(actor, actor.serve.remote(), actor.pid.remote(), endpoints=endpoints)
    ctx.roles.put(RoleId.shard(shard_id), slot)
    return slot


def start_learner_group(
    ctx: RunContext, ports: list[tuple[int, int]] | None = None, epoch: int = 0
) -> list[RoleSlot]:
    """Every rank, the process group formed and each rank's weight endpoints bound; their
    loops not started yet (``run_learners``)."""
    import ray

    from streamrl.controller.actors import LearnerActor

    count, forks = ctx.config.learner.count, ctx.state.forks
    actors = [
        LearnerActor.options(**ctx.placement.options("learner", r)).remote(
            ctx.specs.learner(r, ports[r] if ports else (0, 0), epoch, forks)
        )
        for r in range(count)
    ]
    try:
        master = ray.get(actors[0].rendezvous_address.remote())
        endpoints = ray.get([actor.setup.remote(master) for actor in actors])
    except ray.exceptions.RayError:
        _kill_quietly(actors)  # never registered: nothing else would end them
        raise
    slots = []
    for r, (actor, pair) in enumerate(zip(actors, endpoints, strict=True)):
        slot = RoleSlot(actor, pid_ref=actor.pid.remote(), endpoints=tuple(pair), incarnation=epoch)
        ctx.roles.put(RoleId.learner(r), slot)
        slots.append(slot)
    return slots


def _kill_quietly(actors: list[Any]) -> None:
    import ray

    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already gone
            pass


def announce_epoch(
    ctx: RunContext,
    epoch: int,
    version: int,
    forks: list[int],
    before_each_try: Callable[[], None] | None = None,
) -> None:
    """Tell every shard the learner clock's new epoch (forked at ``version``) before anything
    reads their receipts or figures: each drops what the epoch took back (``dead_timeline``)
    and cancels the replaced group's parked takes. ``before_each_try``: e.g. restart shards
    that died in the same incident (a lost node), on their logs and receipts."""
    from streamrl.buffers.client import BufferClient

    endpoints = [req for _, req in ctx.specs.shard_endpoints]
    client = BufferClient(endpoints, name="controller", epoch=epoch, forks=forks)
    pending, deadline = list(range(len(endpoints))), time.monotonic() + ANNOUNCE_S
    try:
        while pending and time.monotonic() < deadline:
            if before_each_try is not None:
                before_each_try()
            answered = client.announce(version, pending, reply_timeout_s=5.0)
            pending = [s for s in pending if s not in answered]
    finally:
        client.close()
    if pending:
        log.warning("learner epoch %d: shards %s did not answer", epoch, pending)


def run_learners(ctx: RunContext) -> list[Any]:
    """Start every rank's loop; their refs."""
    max_steps = ctx.config.run.max_steps
    for slot in ctx.roles.of_kind("learner rank").values():
        slot.run_ref = slot.actor.run.remote(max_steps)
    return ctx.roles.run_refs("learner rank")


def retry_start(ctx: RunContext, what: str, start: Callable[[], T]) -> T:
    """``start()``, again while the processes it starts die before they run (``start``
    kills what it started when it fails), for up to ``START_RETRY_S``; the last error if it
    never succeeds."""
    import ray

    deadline = time.monotonic() + START_RETRY_S
    while True:
        try:
            return start()
        except ray.exceptions.RayError as exc:
            if time.monotonic() > deadline:
                raise
            log.warning(
                "%s: a new process died before it ran (%s); trying again", what, last_line(exc)
            )
            time.sleep(1.0)


class Recovery:
    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def check_roles(self, record_reports: Callable[[], None]) -> bool:
        """Restart a buffer shard or the learner group when one's loop ended with an error
        (says whether it did); raise a one-line RunError for anything else. A learner rank
        that returned normally is left alone (the group finishes together).
        ``record_reports``: the controller records what is in its report socket."""
        import ray

        ctx = self.ctx
        refs = ctx.roles.run_refs("buffer shard", "learner rank")
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        # Shards first (run_refs' order): a learner restart reads the shards' receipts.
        for ref in sorted(done, key=refs.index):
            role = ctx.roles.role_of(ref)
            if role is None:  # a replaced role's, gone with its restart
                continue
            try:
                ray.get(ref)
                continue
            except ray.exceptions.RayError as exc:
                if ctx.state.stop:
                    logs = ctx.run_dir / "logs"
                    raise RunError(f"{role} failed: {last_line(exc)} (see {logs})") from None
                if role.kind == "buffer shard":
                    self.restart_shard(role.index, exc)
                else:
                    # The dead group's last reports are in the socket: their steps may be
                    # kept (up to the checkpoint), so record them before the version moves.
                    record_reports()
                    self.restart_learner_group(role.index, exc)
                return True
        return False

    def restart_shard(self, shard_id: int, exc: Exception) -> None:
        """A new process for a dead shard, on its durable log and its predecessor's ports
        (generators' and learners' sockets reconnect by themselves). What the log held is
        recovered; a group in a reply that was on the wire is lost."""
        ctx, role = self.ctx, RoleId.shard(shard_id)
        failure, logs, limit = last_line(exc), ctx.run_dir / "logs", ctx.config.run.max_restarts
        if not ctx.config.buffer.durable:
            raise RunError(f"{role} failed: {failure} (buffer.durable is off; see {logs})")
        restarts = ctx.count_restart(str(role), failure)
        ctx.roles.kill(role)
        before = ctx.specs.shard_endpoints[shard_id]

        def start() -> RoleSlot:
            return start_shard(ctx, shard_id, endpoint_ports(before))

        slot = retry_start(ctx, str(role), start)
        if slot.endpoints != tuple(before):
            raise RunError(f"{role} restarted at {slot.endpoints}, not {before}")
        with ctx.state.lock:  # generators resend what the dead process had not logged
            ctx.state.shard_epochs[shard_id] = ctx.state.shard_epochs.get(shard_id, 0) + 1
        ctx.write_pids()
        ctx.note(f"{role}: {failure}; restarted on its log (restart {restarts}/{limit})")
        ctx.metrics.event("restart", role=str(role), failure=failure, restarts=restarts)

    def restart_learner_group(self, rank: int, exc: Exception) -> None:
        """A learner rank died: the whole group starts again from the newest checkpoint, on
        the same weight ports, in the next epoch (module docstring). Generators keep
        generating meanwhile and re-anchor when admission tells them the new epoch. Without a
        checkpoint the run fails at once, naming the rank."""
        import ray

        ctx = self.ctx
        rank, failure = self._first_failed_rank(rank, exc)
        role, limit, logs = "learner group", ctx.config.run.max_restarts, ctx.run_dir / "logs"
        checkpoint = checkpoint_layout.latest(ctx.run_dir / "checkpoints")
        if checkpoint is None:
            raise RunError(
                f"learner rank {rank} failed: {failure}; no checkpoint to restart from "
                f"(run.checkpoint_every={ctx.config.run.checkpoint_every}; see {logs})"
            )
        failure = f"learner rank {rank}: {failure}"
        restarts = ctx.count_restart(role, failure)
        lost_version = ctx.state.version
        old = ctx.roles.of_kind("learner rank")
        for r in old:
            ctx.roles.kill(RoleId.learner(r))
        # Their weight ports are free once the processes are gone.
        old_refs = [slot.run_ref for slot in old.values() if slot.run_ref is not None]
        ray.wait(old_refs, num_returns=len(old_refs), timeout=30)
        ports = [endpoint_ports(pair) for pair in ctx.specs.weight_endpoints]

        def start() -> list[RoleSlot]:
            return start_learner_group(ctx, ports, ctx.state.weights_epoch + 1)

        slots = retry_start(ctx, role, start)
        endpoints = [slot.endpoints for slot in slots]
        if endpoints != [tuple(pair) for pair in ctx.specs.weight_endpoints]:
            raise RunError(f"{role}: the restarted group bound {endpoints}")
        version = ray.get(slots[0].actor.version.remote())
        prompts_again = self._roll_back(version)
        ctx.roles.refresh_pids(wait=True)
        ctx.write_pids()
        run_learners(ctx)
        ctx.note(
            f"{failure}; learner group restarted from {checkpoint.name} "
            f"(version {version}, was {lost_version}; restart {restarts}/{limit})"
        )
        ctx.metrics.event(
            "restart",
            role=role,
            failure=failure,
            restarts=restarts,
            version=version,
            was=lost_version,
            prompts_again=prompts_again,
        )

    def _roll_back(self, version: int) -> list[int]:
        """Tell the shards the new epoch, then read their receipts and roll the budget and
        the prompt ledger back to ``version`` (``RunState.learners_restarted``)."""

        ctx = self.ctx
        dead_epoch = ctx.state.weights_epoch
        forks = [*ctx.state.forks, version]
        # Persisted before any learner of the new epoch trains: a later --resume starts above.
        ctx.start_epoch(dead_epoch + 1, forks)
        announce_epoch(ctx, dead_epoch + 1, version, forks, self.restart_dead_shards)
        ctx.refresh_shard_stats()
        receipts = ctx.state.receipts_after(dead_epoch, version)
        return ctx.state.learners_restarted(
            version,
            forks,
            receipts,
            ctx.config.learner.groups_per_step,
            ctx.config.buffer.max_reuse,
        )

    def restart_dead_shards(self) -> None:
        """Restart every shard whose loop has ended with an error (now, not at the controller
        loop's next turn)."""
        import ray

        for shard_id, slot in self.ctx.roles.of_kind("buffer shard").items():
            if not ray.wait([slot.run_ref], timeout=0)[0]:
                continue
            try:
                ray.get(slot.run_ref)
            except ray.exceptions.RayError as exc:
                self.restart_shard(shard_id, exc)

    def _first_failed_rank(self, rank: int, exc: Exception) -> tuple[int, str]:
        """The rank whose process died, rather than a survivor whose collective broke with it
        (gloo's "connection reset" often ends first): waits up to 2 s for every rank."""
        import ray

        refs = self.ctx.roles.run_refs("learner rank")
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=2)
        for r, ref in enumerate(refs):
            if ref not in done:
                continue
            try:
                ray.get(ref)
            except ray.exceptions.RayError as err:
                if "process died" in last_line(err) or "node died" in last_line(err):
                    return r, last_line(err)
        return rank, last_line(exc)
