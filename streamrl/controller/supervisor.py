"""Generator supervision: replace the dead and the silent, add and retire on demand.

A generator is replaceable: the run's prompts, admission budget and weights live elsewhere.
``GeneratorPool.check`` (called from the controller's loop) acts on each generator id:

| seen                                           | done                                      |
|------------------------------------------------|-------------------------------------------|
| ``run()`` ended with an error (kill -9, crash) | replace it                                |
| no heartbeat for ``run.heartbeat_timeout_s``   | kill it (SIGSTOP too), replace it         |
| no progress for ``run.stall_timeout_s`` while  | kill it, replace it (``workers.progress``)|
| it has work (a wedged forward, a lost version) |                                           |
| ``run()`` returned while retiring or stopping  | forget it                                 |
| more ids than ``generator.count`` (live knob)  | retire the highest: admission says leave  |
| fewer ids than ``generator.count``             | start the lowest free ids                 |

Replacing means: kill the actor, count what the shards acknowledge of its groups (their
delivery receipts, once what it sent has settled), give the rest of what it was admitted back
to the admission budget and their prompts to the ledger (``state.PromptLedger.release``), and
start the same id with the next incarnation, which anchors to the learner's current weights on
its first admission reply. After ``run.max_restarts`` replacements of one id the run fails with
a line naming it. The receipts, not its reports, say what arrived: a generator killed between
pushing and reporting has its pushed groups counted (not generated twice), and a group that died
in its socket is generated again (a synchronous run would wait for it for ever).
"""

from __future__ import annotations

import logging
import time

from streamrl.controller.context import RunContext
from streamrl.controller.roles import RoleId, RoleSlot
from streamrl.controller.rundir import last_line
from streamrl.controller.state import GeneratorHealth

log = logging.getLogger(__name__)

SETTLE_S = 3.0  # at most this long for a dead generator's last groups to reach the shards


class GeneratorPool:
    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    @property
    def slots(self) -> dict[int, RoleSlot]:
        return self.ctx.roles.of_kind("generator")

    # ------------------------------------------------------------------ start and stop

    def start(self, generator_id: int) -> None:
        from streamrl.controller.actors import GeneratorActor

        ctx, state = self.ctx, self.ctx.state
        with state.lock:
            health = state.health.get(generator_id)
            if health is None:
                health = state.health[generator_id] = GeneratorHealth()
            elif generator_id not in self.slots:
                health.incarnation += 1  # reports of the one before are ignored from now
            health.retiring, health.released, health.sender = False, False, ""
        state.not_heard(str(RoleId.generator(generator_id)))
        spec = ctx.specs.generator(generator_id, health.incarnation)
        options = ctx.placement.options("generator", generator_id)
        actor = GeneratorActor.options(**options).remote(spec)
        slot = RoleSlot(actor, actor.run.remote(), actor.pid.remote())
        slot.incarnation = health.incarnation
        ctx.roles.put(RoleId.generator(generator_id), slot)

    def run_refs(self) -> list:
        return self.ctx.roles.run_refs("generator")

    # ------------------------------------------------------------------ supervision

    def check(self, now: float | None = None) -> None:
        """One pass over every generator (table in the module doc); raises RunError when one
        has used up its restarts."""
        import ray

        ctx, state = self.ctx, self.ctx.state
        now = time.time() if now is None else now
        for generator_id, slot in self.slots.items():
            health = state.health[generator_id]
            done, _ = ray.wait([slot.run_ref], timeout=0)
            if done:
                leaving = health.retiring or state.stop
                try:
                    ray.get(slot.run_ref)
                    failure = None if leaving else "exited early"
                except ray.exceptions.RayError as exc:
                    failure = last_line(exc)
                if failure is None:
                    self._forget(generator_id, "retired" if health.retiring else "finished")
                elif leaving:  # no replacement for a generator on its way out
                    self._forget(generator_id, f"failed while leaving: {failure}")
                else:
                    self._replace(generator_id, failure)
                continue
            reason = ctx.roles.unresponsive(
                RoleId.generator(generator_id), state, now, ctx.config.run
            )
            if reason is not None:
                if health.retiring or state.stop:
                    self._forget(generator_id, f"{reason} while leaving")
                else:
                    self._replace(generator_id, reason)
        if not state.stop:
            self._scale(ctx.config.generator.count)

    def _scale(self, target: int) -> None:
        state = self.ctx.state
        live = sorted(g for g in self.slots if not state.health[g].retiring)
        for generator_id in live[target:]:  # highest ids leave; generator 0 (eval) stays
            with state.lock:
                state.health[generator_id].retiring = True
            self.ctx.note(f"generator {generator_id}: retiring (generator.count={target})")
        taken = set(self.slots)
        free = (g for g in range(10**6) if g not in taken)
        for _ in range(target - len(live)):
            generator_id = next(free)
            self.start(generator_id)
            self.ctx.note(f"generator {generator_id}: started (generator.count={target})")

    def _replace(self, generator_id: int, failure: str) -> None:
        ctx, limit = self.ctx, self.ctx.config.run.max_restarts
        role = RoleId.generator(generator_id)
        restarts = ctx.count_restart(str(role), failure)
        returned = self._release(generator_id)
        self.start(generator_id)
        ctx.note(
            f"{role}: {failure}; replaced (restart {restarts}/{limit}), "
            f"{returned} admitted group(s) returned to the budget"
        )
        ctx.metrics.event(
            "restart", role=str(role), failure=failure, restarts=restarts, returned=returned
        )

    def _forget(self, generator_id: int, why: str) -> None:
        if why == "finished":  # the run's end: its report stays for the summary
            self.ctx.roles.kill(RoleId.generator(generator_id))
            self.ctx.roles.forget(RoleId.generator(generator_id))
            return
        returned = self._release(generator_id)
        self.ctx.note(f"generator {generator_id}: {why}; {returned} group(s) returned")

    def _release(self, generator_id: int) -> int:
        """Kill the generator's process and return what it was admitted and no shard has
        (module docstring); how many groups."""
        ctx, role = self.ctx, RoleId.generator(generator_id)
        ctx.roles.kill(role)
        ctx.roles.forget(role)
        return ctx.state.release_generator(generator_id, self._arrived(generator_id))

    def _arrived(self, generator_id: int) -> dict[int, int] | None:
        """The shards' delivery floors of the dead generator's groups, once they stop rising
        (what it sent before dying may still be in the shards' queues); None if unknown."""
        ctx = self.ctx
        deadline, arrived = time.monotonic() + SETTLE_S, None
        while True:
            try:
                ctx.refresh_shard_stats(reply_timeout_s=SETTLE_S)
            except Exception:  # a shard down: go by the reports
                log.exception("generator %d: shard receipts unreadable", generator_id)
                return None
            with ctx.state.lock:
                now = ctx.state.arrived_from(generator_id, ctx.config.buffer.shards)
            if now is None or now == arrived or time.monotonic() > deadline:
                return now
            arrived = now
            time.sleep(0.3)
