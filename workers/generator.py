"""Generator role: sample prompt groups forever and push them to the buffer shards.

Loop (waits for -> unblocked by):
  1. admission for new groups       -> the learner's version advancing (docs/design.md §3)
  2. weights fresh enough for them  -> the subscriber applying the next version
  3. generate (weights applied between decode steps when in-flight updates are on)
  4. reward, push to a shard        -> PUSH blocks only at the shard's high-water mark

Each admission reply has four parts, each handled by one method (``Generator.run``): the
learner clock (``weights.follow_clock``), the delivery receipts (``pushers.take_receipts``),
the directives (``obey``: knobs, evaluation, stop or retire) and the grant
(``generate_granted``: steps 2-4).

Built from its spec and four parts, each the one owner of its facts: ``generator_sockets``
(admission; a pusher and an outbox per shard, receipts), ``generator_reports`` (reports and the
heartbeat thread), ``generator_weights`` (the subscriber, the learner clock as heard, the
version and epoch the engine holds, anchors) and ``sampling`` (prompts, sampling parameters,
rewards, episodes). Here: the engine, the loop, evaluation, the activity timers, the ending.
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
from streamrl.data import Prompt
from streamrl.evaluation import EvalResult, evaluates_in_slack
from streamrl.models import load_tokenizer
from streamrl.protocol import Directives, EvalReport, GeneratorReport, Grant
from streamrl.role_specs import GeneratorSpec
from streamrl.transport import resolve_host
from streamrl.workers.engines import Engine, build_engine
from streamrl.workers.eval_process import SlackEvaluator
from streamrl.workers.generator_reports import Reporting, generator_report
from streamrl.workers.generator_sockets import AdmissionClient, ShardPushers
from streamrl.workers.generator_weights import GeneratorWeights
from streamrl.workers.sampling import Sampler
from streamrl.workers.scoring import GroupScoring

log = logging.getLogger(__name__)

# How a generator's run ends: ``stop`` drains to the learner's final version, ``retire`` not.
Ending = Literal["stop", "retire"]


class Generator:
    """One generator process. ``spec``: its whole wiring (``role_specs.GeneratorSpec``)."""

    def __init__(self, spec: GeneratorSpec) -> None:
        # First: the Python API's callables, before the engine, the rewards, the environments
        # or an evaluation resolves a ``python:`` name (``streamrl.callables``).
        install_callables(spec.callables)
        config, gen = spec.config, spec.config.generator
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
        self.tokenizer = load_tokenizer(model_dir)
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
        self.pushers = ShardPushers.connect(
            self.ctx, spec.shard_endpoints, sender, spec.generator_id
        )
        # Always hooked: each decode step is progress (workers.progress), whatever else runs.
        self.sampler = Sampler(
            config,
            self.engine,
            self.tokenizer,
            spec.generator_id,
            self._between_steps,
            on_rule_group=self.reporting.progress.tick,  # each group the rules scored
        )
        # Served rewards (docs/design.md §7c): groups wait for their scores here while the
        # engine samples on; None when every reward is a rule.
        self.scoring = (
            GroupScoring(
                self.ctx,
                config,
                dict(spec.reward_endpoints),
                sender,
                self.sampler.question,
                self.sampler.settle,
            )
            if spec.reward_endpoints
            else None
        )
        self.prompts_per_call = gen.prompts_per_call
        self.eval_set: list[Prompt] | None = None  # loaded when this generator is first asked
        # The newest (learner epoch, version) an evaluation was asked for and answered: a
        # restarted learner group's epoch repeats version numbers of weights that are gone.
        self.evaluated = (-1, -1)
        self.eval_dispatched = (-1, -1)  # the newest handed to the evaluation process
        # Generator 0's evaluation process (eval.runs_on: slack), started with it so that its
        # engine loads while this one samples; None: evaluations run in this loop.
        self.slack_eval: SlackEvaluator | None = None
        if spec.generator_id == 0 and config.eval.every > 0 and evaluates_in_slack(config):
            self.slack_eval = SlackEvaluator(spec)

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
            if self.slack_eval is not None:
                self.slack_eval.follow_clock(clock)
                self.forward_evaluations()
            self.pushers.take_receipts(receipts)
            if self.scoring is not None:
                self.scoring.take_epochs(receipts.scorer_epochs, receipts.scorer_endpoints)
                self.push_scored()
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
        asked = (directives.eval_epoch, directives.eval_version)
        if directives.eval_version >= 0 and asked > max(self.evaluated, self.eval_dispatched):
            first = self.evaluated[1] < 0
            slack = self.slack_eval
            if slack is not None and slack.ask(asked[1], asked[0], final=False, unseen=first):
                self.eval_dispatched = asked
            else:
                # Work: a held-out rule that hangs stalls this generator, seen and replaced.
                with self.reporting.timing("eval_s"), self.reporting.progress.working():
                    self.evaluate(directives.eval_version, directives.eval_epoch)
        return None

    def forward_evaluations(self, wait_s: float = 0.0) -> list[tuple[int, int]]:
        """Send the controller what the evaluation process answered; returns the (epoch,
        version) pairs it finished (answered or abandoned). A dead process: its pending
        request is asked again here in the loop."""
        slack = self.slack_eval
        assert slack is not None
        finished = []
        for message in slack.take(wait_s):
            if message[0] == "result":
                _, version, epoch, result, held_epoch = message
                self.report_evaluation(result, version, epoch, held_epoch)
            else:
                _, version, epoch = message
                log.warning(
                    "generator[%d]: evaluation of v%d abandoned", self.generator_id, version
                )
                if self.eval_dispatched == (epoch, version):  # else a newer ask is in flight
                    self.eval_dispatched = self.evaluated  # the controller asks again
            finished.append((epoch, version))
        if not slack.alive():
            log.error(
                "generator[%d]: the evaluation process exited (%s); evaluating here",
                self.generator_id,
                slack.process.exitcode,
            )
            self.slack_eval = None
            self.eval_dispatched = self.evaluated
        return finished

    def generate_granted(self, grant: Grant) -> bool:
        """Wait for weights fresh enough, generate the granted prompts' groups and push them;
        with nothing granted, apply weights and report meanwhile. False if the run stopped
        while waiting for the weights."""
        if grant.granted == 0:
            with self.reporting.timing("wait_admission_s"):
                self.weights.poll()
                self.reporting.report()
                if self.scoring is not None and self.scoring.pending:
                    self.push_scored(wait_ms=20)
                else:
                    time.sleep(0.02)
            return True
        first = self.pushers.take_grant(grant.granted)  # counted as the ledger counts grants
        with self.reporting.timing("wait_weights_s"):
            held = self.weights.wait_for_version(
                grant.min_version, run_goes_on=self._run_goes_on, meanwhile=self.push_scored
            )
        if not held:
            return False
        if self.slack_eval is not None:
            self.slack_eval.shut()  # sampling: the evaluation process waits
        with self.reporting.timing("busy_s"), self.reporting.progress.working():
            epoch = self.weights.held_epoch
            groups = self.sampler.generate_groups(grant.prompt_indices, epoch)
            self.pushers.address(groups, first)  # by grant: pushed in whatever order they settle
            if self.scoring is None:
                self.pushers.push(groups)
            else:  # scored by the reward roles while the next call samples
                refused = [g for g in groups if g.unscored]  # by its rules: nothing to score
                if refused:
                    self.pushers.push(refused)
                self.scoring.submit([g for g in groups if not g.unscored])
                self.push_scored()
        if self.slack_eval is not None:
            self.slack_eval.open()
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
        if self.scoring is not None and self.scoring.pending:
            self.push_scored()

    def push_scored(self, wait_ms: int = 0) -> None:
        """Push the groups whose served scores are all in (``workers.scoring``)."""
        if self.scoring is not None:
            scored = self.scoring.pump(wait_ms)
            if scored:
                self.pushers.push(scored)

    def finish(self, drain: bool) -> dict[str, int]:
        """Leave the run. ``drain`` (it stopped): first apply versions up to the learner's
        final one and evaluate those final weights (the evaluator only). Then wait for the
        shards' receipts of every group pushed."""
        weights = self.weights
        if drain:
            stop_at = time.monotonic() + self.config.run.drain_timeout_s
            weights.wait_for_version(weights.learner_version, stop_at)
            evaluator = self.generator_id == 0 and self.config.eval.every > 0
            if evaluator and self.slack_eval is not None:
                self._evaluate_due_in_slack(stop_at)
            final = (weights.held_epoch, self.engine.version)
            if evaluator and final > self.evaluated:
                # The final weights: what the run produced.
                if not self._evaluate_final_in_slack(final, stop_at):
                    self.evaluate(self.engine.version, weights.held_epoch, final=True)
        if self.scoring is not None:  # what waits for scores is pushed (or refused) first
            stop_at = time.monotonic() + self.config.run.drain_timeout_s
            while self.scoring.pending and time.monotonic() < stop_at:
                self.push_scored(wait_ms=50)
            self.push_scored()
            self.scoring.finish_evals()  # an evaluation's report goes with what came in
        self.pushers.await_receipts(self.admission)
        self.reporting.report(force=True)
        return {"version": self.engine.version, "groups": self.pushers.groups_pushed}

    def _evaluate_due_in_slack(self, stop_at: float) -> None:
        """The evaluations the controller still has due when the run stops (a fast run can
        outpace the evaluation process): asked one at a time, the oldest first, as in the
        loop, until none is due or ``stop_at``."""
        while self.slack_eval is not None and time.monotonic() < stop_at:
            directives = self.admission.request(0).parts()[1]
            asked = (directives.eval_epoch, directives.eval_version)
            if directives.eval_version < 0:
                return
            if asked > max(self.evaluated, self.eval_dispatched):
                first = self.evaluated[1] < 0
                if not self.slack_eval.ask(asked[1], asked[0], final=False, unseen=first):
                    return
                self.eval_dispatched = asked
            self.forward_evaluations(wait_s=0.5)

    def _evaluate_final_in_slack(self, final: tuple[int, int], stop_at: float) -> bool:
        """The final evaluation by the evaluation process (the run's other roles are done: it
        has the cores); False if there is none or it did not answer by ``stop_at``."""
        slack = self.slack_eval
        if slack is None or not slack.ask(final[1], final[0], final=True, unseen=True):
            return False
        while time.monotonic() < stop_at and self.slack_eval is not None:
            if final in self.forward_evaluations(wait_s=0.5):
                return self.evaluated == final
        return False

    def _run_goes_on(self) -> bool:
        """Asked once a second while waiting for weights: the reply's receipts and clock are
        taken as the loop would; False if the run stopped meanwhile."""
        _, directives, clock, receipts = self.admission.request(0).parts()
        self.pushers.take_receipts(receipts)
        self.weights.follow_clock(clock)
        return not directives.stop

    def _figures(self) -> GeneratorReport:
        pushed, timers = self.pushers.groups_pushed, self.reporting.timers
        scoring = self.scoring.snapshot() if self.scoring is not None else None
        return generator_report(
            self.generator_id,
            self.incarnation,
            self.weights,
            self.sampler,
            pushed,
            timers,
            scoring,
        )

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, version: int, epoch: int, final: bool = False) -> None:
        """Held-out evaluation on weights >= ``version`` of learner epoch ``epoch``
        (``streamrl.evaluation``); its responses go to the controller as figures, never to
        the buffer. The first and the ``final`` one also ask the questions in a wording
        training never uses (``eval.unseen_phrasing``). Not run if those weights cannot come
        (the run stopped, or the learners restarted meanwhile: the controller asks again)."""
        from streamrl.workers.evaluator import evaluate_held_out

        eval_set = self.held_out()
        stop_at = time.monotonic() + self.config.run.drain_timeout_s
        watch = None if final else self._run_goes_on
        if not self.weights.wait_for_version(version, stop_at, watch, epoch=epoch):
            log.warning(
                "generator[%d]: evaluation of version %d (epoch %d) abandoned: holding %d "
                "(epoch %d)",
                self.generator_id,
                version,
                epoch,
                self.engine.version,
                self.weights.held_epoch,
            )
            return
        unseen = final or self.evaluated[1] < 0
        result = evaluate_held_out(self.engine, self.tokenizer, self.config, eval_set, unseen)
        self.report_evaluation(result, version, epoch, self.weights.held_epoch)

    def held_out(self) -> list[Prompt]:
        """The run's held-out prompts (``evaluation.eval_prompts``), read when first needed."""
        if self.eval_set is None:
            from streamrl.evaluation import eval_prompts

            self.eval_set = eval_prompts(self.config)
        return self.eval_set

    def report_evaluation(self, result: EvalResult, version: int, epoch: int, held: int) -> None:
        """Send the controller an evaluation of ``version`` (asked for in learner epoch
        ``epoch``; ``held``: the epoch of the weights evaluated), with the served rewards'
        view of its responses: then it goes when their scores come in (``_score_eval``),
        while this generator samples on."""
        self.evaluated = max(self.evaluated, (epoch, version))
        report = EvalReport(
            self.generator_id, version, result.version, result.metrics, time.time(), held
        )
        if self.scoring is None or not self._score_eval(result, report):
            self._send_eval(report)

    def _send_eval(self, report: EvalReport) -> None:
        self.reporting.send_eval(report)
        log.info(
            "generator[%d]: evaluated version %d: %s",
            self.generator_id,
            report.version,
            report.metrics,
        )

    def _score_eval(self, result: EvalResult, report: EvalReport) -> bool:
        """Send the held-out responses to the served rewards and return at once (False:
        none to score); ``report`` is sent from a later pump with their view beside the
        rules' exact check: ``eval/reward/<label>`` (the mean raw score) and
        ``.../unparsable``. An RLHF job reads the model reward and the true accuracy side
        by side here. The generator never waits for these scores (``score_later``)."""
        from streamrl.protocol import ScoreItemWire

        assert self.scoring is not None
        # The held-out set is read here too: evaluated in the evaluation process, its
        # responses come back to a generator that never loaded it.
        questions = {p.prompt_id: p.question for p in self.held_out()}
        items = [
            ScoreItemWire(questions.get(s["prompt_id"], ""), s["response"], s["ground_truth"])
            for s in result.samples
        ]
        if not items:
            return False
        self.scoring.score_later(items, functools.partial(self._eval_scored, report))
        return True

    def _eval_scored(self, report: EvalReport, scored: dict) -> None:
        for reward, (scores, _identity) in scored.items():
            label = self.config.rewards[reward].display_name()
            present = [s for s in scores if s is not None]
            if present:
                report.metrics[f"eval/reward/{label}"] = sum(present) / len(present)
            report.metrics[f"eval/reward/{label}/unparsable"] = float(len(scores) - len(present))
        self._send_eval(report)

    def close(self) -> None:
        if self.slack_eval is not None:
            self.slack_eval.close()
        if self.scoring is not None:
            self.scoring.close()
        self.sampler.close()
        self.reporting.close()
        self.weights.close()
        self.engine.shutdown()
        self.ctx.destroy(linger=0)
