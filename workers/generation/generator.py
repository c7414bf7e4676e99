"""Generator role: sample prompt groups forever and push them to the buffer shards.

Loop (waits for -> unblocked by):
  1. admission for new groups       -> the learner's version advancing (docs/design.md §3)
  2. weights fresh enough for them  -> the subscriber applying the next version
  3. generate (weights applied between decode steps when in-flight updates are on)
  4. reward, push to a shard        -> PUSH blocks only at the shard's high-water mark

Each admission reply has four parts, each handled by one call (``Generator.run``): the
learner clock (``weights.follow_clock``, ``evaluations.follow``), the delivery receipts
(``delivery.take_receipts``), the directives (``obey``: knobs, evaluation, stop or retire)
and the grant (``generate_granted``: steps 2-4).

Built from its spec and named parts, each the one owner of its facts: ``generator_reports``
(reports and the heartbeat thread), ``generator_weights`` (the subscriber, the learner clock
as heard, the version and epoch the engine holds, anchors), ``sampling`` (prompts, sampling
parameters, rewards, episodes), ``generator_sockets.AdmissionClient`` (admission),
``generator_delivery`` (a pusher and an outbox per shard, receipts, and served scoring, or
``NoScoring``) and ``generator_evaluations`` (generator 0's held-out evaluations, inline or
in its evaluation process, or ``NoEvaluations``). An optional concern is a part with a null
part, never a branch here: the loop reads the same whichever is configured. Here: the
engine, the loop, the activity timers, the ending.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from pathlib import Path
from typing import Literal

import torch
import zmq

from streamrl.buffers.delivery import new_sender
from streamrl.callables import install as install_callables
from streamrl.cores import role_threads
from streamrl.models import load_tokenizer
from streamrl.protocol import Directives, GeneratorReport, Grant
from streamrl.role_specs import GeneratorSpec
from streamrl.transport import resolve_host
from streamrl.workers.engines import Engine, build_engine
from streamrl.workers.generation.generator_delivery import Delivery
from streamrl.workers.generation.generator_evaluations import evaluations_for
from streamrl.workers.generation.generator_reports import Reporting, generator_report
from streamrl.workers.generation.generator_sockets import AdmissionClient
from streamrl.workers.generation.generator_weights import GeneratorWeights
from streamrl.workers.generation.sampling import Sampler

log = logging.getLogger(__name__)

# How a generator's run ends: ``stop`` drains to the learner's final version, ``retire`` not.
Ending = Literal["stop", "retire"]


class Generator:
    """One generator process. ``spec``: its whole wiring (``role_specs.GeneratorSpec``)."""

    def __init__(self, spec: GeneratorSpec) -> None:
        # First: the Python API's callables, before the engine, the rewards, the environments
        # or an evaluation resolves a ``python:`` name (``streamrl.callables``).
        install_callables(spec.callables)
        config = spec.config
        self.config, self.generator_id = config, spec.generator_id
        self.incarnation = spec.incarnation
        # The controller resolves threads (0 = auto); a role built directly resolves its own.
        self.threads = role_threads(config, "generator", None, len(os.sched_getaffinity(0)))
        torch.set_num_threads(self.threads)
        self.ctx = zmq.Context()
        # First, before the model loads: the supervisor hears this process from the start.
        self.reporting = Reporting(
            self.ctx, spec.report_endpoint, spec.generator_id, spec.incarnation, self._figures
        )
        model_dir = Path(spec.model_dir)
        tokenizer = load_tokenizer(model_dir)
        self.engine = build_engine(
            config, model_dir, spec.generator_id, resolve_host(spec.bind_host)
        )
        self.weights = GeneratorWeights(
            self.ctx,
            self.engine,
            spec,
            self.reporting.timers,
            functools.partial(self.reporting.report, force=True),
            self.reporting.progress,
        )
        # Acknowledged delivery (buffers.delivery): one sender name for admission and shards.
        sender = new_sender()
        self.admission = AdmissionClient(
            self.ctx, spec.admission_endpoint, spec.generator_id, spec.incarnation, sender
        )
        # Always hooked: each decode step is progress (workers.progress), whatever else runs.
        self.sampler = Sampler(
            config,
            self.engine,
            tokenizer,
            spec.generator_id,
            self._between_steps,
            on_rule_group=self.reporting.progress.tick,  # each group the rules scored
        )
        # Served rewards (docs/design.md §7c): groups wait for their scores there while the
        # engine samples on.
        self.delivery = Delivery.connect(self.ctx, spec, sender, self.sampler)
        self.prompts_per_call = config.generator.prompts_per_call
        # Last: generator 0's evaluation process loads its engine while this one samples.
        self.evaluations = evaluations_for(
            spec,
            tokenizer=tokenizer,
            weights=self.weights,
            reporting=self.reporting,
            delivery=self.delivery,
            admission=self.admission,
            run_goes_on=self._run_goes_on,
        )

    # ------------------------------------------------------------------ loop

    def run(self) -> dict[str, int]:
        """Ask for groups and handle the reply's parts until told to stop or retire."""
        # Again on this thread: a Ray actor runs its methods on other threads than __init__,
        # and where libgomp is preloaded OpenMP's thread count does not follow them there.
        torch.set_num_threads(self.threads)
        while True:
            with self.reporting.timing("wait_admission_s"):
                reply = self.admission.request(self.prompts_per_call)
            grant, directives, clock, receipts = reply.parts()
            self.weights.follow_clock(clock)
            self.evaluations.follow(clock)
            self.delivery.take_receipts(receipts)
            ending = self.obey(directives)
            if ending is None and not self.generate_granted(grant):
                ending = "stop"  # the run stopped while this generator waited for weights
            if ending is not None:
                return self.finish(drain=ending == "stop")

    def obey(self, directives: Directives) -> Ending | None:
        """Apply the live knobs and run an evaluation asked for; how the run ends, if it
        does."""
        if directives.prompts_per_call is not None:
            self.prompts_per_call = directives.prompts_per_call
        if directives.temperature is not None:
            self.sampler.set_temperature(directives.temperature)
        if directives.retire:  # generator.count lowered: every granted group is pushed
            log.info("generator[%d]: retiring", self.generator_id)
            return "retire"
        if directives.stop:
            return "stop"
        self.evaluations.obey(directives)
        return None

    def generate_granted(self, grant: Grant) -> bool:
        """Wait for weights fresh enough, generate the granted prompts' groups and deliver
        them; with nothing granted, apply weights and report meanwhile. False if the run
        stopped while waiting for the weights."""
        if grant.granted == 0:
            with self.reporting.timing("wait_admission_s"):
                self.weights.poll()
                self.reporting.report()
                self.delivery.wait(20)  # for served scores, if some are pending
            return True
        first = self.delivery.take_grant(grant.granted)  # counted as the ledger counts grants
        with self.reporting.timing("wait_weights_s"):
            held = self.weights.wait_for_grant(
                grant.min_version, run_goes_on=self._run_goes_on, meanwhile=self.delivery.pump
            )
        if not held:
            return False
        self.evaluations.shut()  # sampling: the evaluation process waits
        with self.reporting.timing("busy_s"), self.reporting.progress.working():
            epoch = self.weights.held_epoch
            groups = self.sampler.generate_groups(grant.prompt_indices, epoch, grant.candidates)
            self.delivery.deliver(groups, first)  # scored by the reward roles meanwhile
        self.evaluations.open()
        self.reporting.timers.calls += 1
        # After every call: the controller's per-step figures count the groups just pushed.
        self.reporting.report(force=True)
        return True

    def _between_steps(self, engine: Engine) -> None:
        """The engine's hook between decode steps: a step of progress, in-flight weight
        updates (when on) and the served scores that came in (pushed at once: the learner
        may wait for them)."""
        self.reporting.progress.tick()
        if self.config.generator.in_flight_updates:
            self.weights.poll(engine)
        if self.delivery.pending:
            self.delivery.pump()

    def finish(self, drain: bool) -> dict[str, int]:
        """Leave the run. ``drain`` (it stopped): first apply versions up to the learner's
        final one and evaluate those final weights (generator 0). Then push what waits for
        served scores and wait for the shards' receipts of every group pushed."""
        weights = self.weights
        if drain:
            stop_at = time.monotonic() + self.config.run.drain_timeout_s
            weights.wait_for_version(weights.learner_version, stop_at)
            self.evaluations.finish(stop_at)
        self.delivery.drain(time.monotonic() + self.config.run.drain_timeout_s)
        self.delivery.await_receipts(self.admission)
        self.reporting.report(force=True)
        return {"version": self.engine.version, "groups": self.delivery.groups_pushed}

    def _run_goes_on(self) -> bool:
        """Asked once a second while waiting for weights: the reply's receipts and clock are
        taken as the loop would; False if the run stopped meanwhile."""
        _, directives, clock, receipts = self.admission.request(0).parts()
        self.delivery.take_shard_receipts(receipts)
        self.weights.follow_clock(clock)
        return not directives.stop

    def _figures(self) -> GeneratorReport:
        return generator_report(
            self.generator_id,
            self.incarnation,
            self.weights,
            self.sampler,
            self.delivery.groups_pushed,
            self.reporting.timers,
            self.delivery.snapshot(),
        )

    def close(self) -> None:
        self.evaluations.close()
        self.delivery.close()
        self.sampler.close()
        self.reporting.close()
        self.weights.close()
        self.engine.shutdown()
        self.ctx.destroy(linger=0)
