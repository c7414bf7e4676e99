"""Generator supervision: replace the dead and the silent, add and retire on demand.

A generator is replaceable: the run's prompts, admission budget and weights live elsewhere.
``GeneratorPool.check`` (called from the controller's loop) acts on each generator id:

| seen                                           | done                                      |
|------------------------------------------------|-------------------------------------------|
| ``run()`` ended with an error (kill -9, crash) | replace it                                |
| no heartbeat for ``run.heartbeat_timeout_s``   | kill it (SIGSTOP too), replace it         |
| ``run()`` returned while retiring or stopping  | forget it                                 |
| more ids than ``generator.count`` (live knob)  | retire the highest: admission says leave  |
| fewer ids than ``generator.count``             | start the lowest free ids                 |

Replacing means: kill the actor, give its admitted-but-undelivered groups back to the admission
budget and their prompts to the ledger (``state.PromptLedger``), and start the same id with the
next incarnation, which anchors to the learner's current weights on its first admission reply.
After ``run.max_restarts`` replacements of one id the run fails with a line naming it.

Known gap: a generator killed between pushing a call's groups and reporting them has those
prompts handed out again, so they are generated twice (both groups are trained on).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamrl.controller.rundir import last_line
from streamrl.controller.state import GeneratorHealth

if TYPE_CHECKING:
    from streamrl.controller.run import Controller

log = logging.getLogger(__name__)

FIRST_BEAT_GRACE_S = 60.0  # a fresh actor process imports torch before its first heartbeat


@dataclass
class Slot:
    actor: Any
    run_ref: Any
    started_at: float
    pid_ref: Any = None
    pid: int | None = None


class GeneratorPool:
    def __init__(self, controller: Controller) -> None:
        self.c = controller
        self.slots: dict[int, Slot] = {}

    # ------------------------------------------------------------------ start and stop

    def start(self, generator_id: int) -> None:
        from streamrl.controller.actors import GeneratorActor

        state = self.c.state
        with state.lock:
            health = state.health.get(generator_id)
            if health is None:
                health = state.health[generator_id] = GeneratorHealth()
            elif generator_id not in self.slots:
                health.incarnation += 1  # reports of the one before are ignored from now
            health.retiring, health.last_heartbeat = False, None
        spec = self.c.generator_spec(generator_id, health.incarnation)
        options = self.c.placement.options("generator", generator_id)
        actor = GeneratorActor.options(**options).remote(spec)
        self.slots[generator_id] = Slot(actor, actor.run.remote(), time.time(), actor.pid.remote())

    def run_refs(self) -> list[Any]:
        return [slot.run_ref for slot in self.slots.values()]

    def pids(self, wait: bool = False) -> list[int]:
        """The generators' process ids; without ``wait``, those whose actor is up already."""
        import ray

        for slot in self.slots.values():
            if slot.pid is None and (wait or ray.wait([slot.pid_ref], timeout=0)[0]):
                try:
                    slot.pid = ray.get(slot.pid_ref)
                except ray.exceptions.RayError:  # died starting: check() replaces it
                    slot.pid = -1
        return [slot.pid for slot in self.slots.values() if slot.pid and slot.pid > 0]

    def kill_all(self) -> None:
        for generator_id in self.slots:
            self._kill(generator_id)

    # ------------------------------------------------------------------ supervision

    def check(self, now: float | None = None) -> None:
        """One pass over every generator (table in the module doc); raises RunError when one
        has used up its restarts."""
        import ray

        now = time.time() if now is None else now
        for generator_id, slot in list(self.slots.items()):
            health = self.c.state.health[generator_id]
            done, _ = ray.wait([slot.run_ref], timeout=0)
            if done:
                leaving = health.retiring or self.c.state.stop
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
            silent_for = now - (health.last_heartbeat or slot.started_at + FIRST_BEAT_GRACE_S)
            if silent_for > self.c.config.run.heartbeat_timeout_s:
                reason = f"no heartbeat for {silent_for:.0f} s"
                if health.retiring or self.c.state.stop:
                    self._forget(generator_id, f"{reason} while leaving")
                else:
                    self._replace(generator_id, reason)
        if not self.c.state.stop:
            self._scale(self.c.config.generator.count)

    def _scale(self, target: int) -> None:
        live = sorted(g for g in self.slots if not self.c.state.health[g].retiring)
        for generator_id in live[target:]:  # highest ids leave; generator 0 (eval) stays
            with self.c.state.lock:
                self.c.state.health[generator_id].retiring = True
            self.c.note(f"generator {generator_id}: retiring (generator.count={target})")
        free = (g for g in range(10**6) if g not in self.slots)
        for _ in range(target - len(live)):
            generator_id = next(free)
            self.start(generator_id)
            self.c.note(f"generator {generator_id}: started (generator.count={target})")

    def _replace(self, generator_id: int, failure: str) -> None:
        state, limit = self.c.state, self.c.config.run.max_restarts
        role = f"generator {generator_id}"
        health = state.health[generator_id]
        health.restarts = self.c.count_restart(role, failure)
        health.last_failure = failure
        self._kill(generator_id)
        returned = state.release_generator(generator_id)
        del self.slots[generator_id]
        self.start(generator_id)
        self.c.note(
            f"{role}: {failure}; replaced (restart {health.restarts}/{limit}), "
            f"{returned} admitted group(s) returned to the budget"
        )
        self.c.metrics.event(
            "restart", role=role, failure=failure, restarts=health.restarts, returned=returned
        )

    def _kill(self, generator_id: int) -> None:
        import ray

        try:
            ray.kill(self.slots[generator_id].actor, no_restart=True)
        except Exception:  # already gone
            pass

    def _forget(self, generator_id: int, why: str) -> None:
        self._kill(generator_id)  # its run() is over; the actor process goes now, not later
        del self.slots[generator_id]
        if why == "finished":  # the run's end: its report stays for the summary
            return
        returned = self.c.state.release_generator(generator_id)
        self.c.note(f"generator {generator_id}: {why}; {returned} group(s) returned")
