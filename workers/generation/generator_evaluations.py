"""Generator 0's held-out evaluations: the generator side's one home for them (docs/design.md §5).

The controller asks (``Directives.eval_version`` of learner epoch ``eval_epoch``, generator 0
only); this part answers, by one interface whoever evaluates:

- ``HeldOutEvaluations`` with ``NoProcess``: inline, in generator 0's loop between calls.
- ``HeldOutEvaluations`` with a ``SlackEvaluator`` (``eval.runs_on``, ``eval_process``): the
  ask goes to the evaluation process, which works only while generator 0 does not sample
  (``shut``/``open`` around each engine call), and its answers are forwarded from the loop. A
  process that dies is replaced by ``NoProcess``: what it had pending is asked again by the
  controller and evaluated inline.
- ``NoEvaluations``: generators other than 0, or ``eval.every: 0``; never asked.

Either way the result goes to the controller as an ``EvalReport``, with the served rewards'
view of its responses when the run serves rewards (``Delivery.score_responses``: it goes when
their scores are in, while generator 0 samples on). When the run stops, the evaluations still
due and the final weights are evaluated (``finish``).

Invariant: ``evaluated`` is the newest (learner epoch, version) answered, ``dispatched`` the
newest handed to the process; an ask not above both is already answered or in flight. They
are pairs: a restarted learner group's epoch repeats version numbers of weights that are gone.

Example: inline, asked (0, 10) -> evaluated now, ``evaluated == (0, 10)``; asked (0, 10) again
-> nothing. With a process: ``dispatched == (0, 10)`` at once, ``evaluated`` when its answer
is forwarded; an ``Abandoned`` answer sets ``dispatched`` back, so the next ask goes again.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from streamrl import eval_answers
from streamrl.evaluation import EvalResult, evaluates_in_slack
from streamrl.protocol import Directives, EvalReport, LearnerClockInfo
from streamrl.workers.generation.eval_process import Abandoned, Evaluated, SlackEvaluator

if TYPE_CHECKING:
    from streamrl.config import Config
    from streamrl.data import Prompt
    from streamrl.role_specs import GeneratorSpec
    from streamrl.workers.generation.generator_delivery import Delivery
    from streamrl.workers.generation.generator_reports import Reporting
    from streamrl.workers.generation.generator_sockets import Admission
    from streamrl.workers.generation.generator_weights import GeneratorWeights
    from streamrl.workers.generation.scoring import Served

log = logging.getLogger(__name__)


class Evaluations(Protocol):
    """What the generator's loop calls, whoever evaluates (module doc)."""

    def follow(self, clock: LearnerClockInfo) -> None: ...

    def obey(self, directives: Directives) -> None: ...

    def shut(self) -> None: ...

    def open(self) -> None: ...

    def finish(self, stop_at: float) -> None: ...

    def close(self) -> None: ...


class EvalProcess(Protocol):
    """Where an ask goes out of the loop: ``SlackEvaluator``, or ``NoProcess`` (inline)."""

    in_process: bool

    def follow_clock(self, clock: LearnerClockInfo) -> None: ...

    def ask(self, version: int, epoch: int, final: bool, unseen: bool) -> bool: ...

    def take(self, timeout_s: float = 0.0) -> list[Evaluated | Abandoned]: ...

    def exited(self) -> bool: ...

    @property
    def exitcode(self) -> int | None: ...

    def shut(self) -> None: ...

    def open(self) -> None: ...

    def close(self) -> None: ...


class NoProcess:
    """No evaluation process: every ask is refused, so generator 0 evaluates inline."""

    in_process = False
    exitcode = None

    def follow_clock(self, clock: LearnerClockInfo) -> None:
        pass

    def ask(self, version: int, epoch: int, final: bool, unseen: bool) -> bool:
        return False

    def take(self, timeout_s: float = 0.0) -> list[Evaluated | Abandoned]:
        return []

    def exited(self) -> bool:
        return False

    def shut(self) -> None:
        pass

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass


class NoEvaluations:
    """The part of a generator that is never asked to evaluate."""

    def follow(self, clock: LearnerClockInfo) -> None:
        pass

    def obey(self, directives: Directives) -> None:
        pass

    def shut(self) -> None:
        pass

    def open(self) -> None:
        pass

    def finish(self, stop_at: float) -> None:
        pass

    def close(self) -> None:
        pass


class HeldOutEvaluations:
    """Generator 0's evaluations, inline or by ``process`` (module doc). ``run_goes_on``:
    asked once a second while an inline evaluation waits for its weights; ``admission``
    asked for what is still due when the run stops."""

    def __init__(
        self,
        config: Config,
        generator_id: int,
        *,
        tokenizer: object,
        weights: GeneratorWeights,
        reporting: Reporting,
        delivery: Delivery,
        admission: Admission,
        run_goes_on: Callable[[], bool],
        process: EvalProcess,
    ) -> None:
        self.config, self.generator_id, self.tokenizer = config, generator_id, tokenizer
        self.weights, self.reporting, self.delivery = weights, reporting, delivery
        self.admission, self.run_goes_on, self.process = admission, run_goes_on, process
        self.eval_set: list[Prompt] | None = None  # loaded when first needed
        self.evaluated = (-1, -1)
        self.dispatched = (-1, -1)

    # ------------------------------------------------------------------ the loop's calls

    def follow(self, clock: LearnerClockInfo) -> None:
        """Each admission reply: the process follows the learner clock, and what it
        answered goes on to the controller."""
        self.process.follow_clock(clock)
        self.forward()

    def obey(self, directives: Directives) -> None:
        """Run the evaluation asked for (or hand it to the process), unless it is answered
        or in flight."""
        asked = (directives.eval_epoch, directives.eval_version)
        if directives.eval_version < 0 or not self._new(asked) or self._hand_over(asked):
            return
        # Work: a held-out rule that hangs stalls this generator, seen and replaced.
        with self.reporting.timing("eval_s"), self.reporting.progress.working():
            self.evaluate(directives.eval_version, directives.eval_epoch)

    def shut(self) -> None:
        """Generator 0 samples: its evaluation process waits."""
        self.process.shut()

    def open(self) -> None:
        self.process.open()

    def finish(self, stop_at: float) -> None:
        """The run stopped and the learner's final version is applied (or ``stop_at``
        passed): the evaluations still due, then the final weights, what the run produced."""
        self._ask_due(stop_at)
        final = (self.weights.held_epoch, self.weights.engine.version)
        if final > self.evaluated and not self._final_in_process(final, stop_at):
            self.evaluate(self.weights.engine.version, self.weights.held_epoch, final=True)

    def close(self) -> None:
        self.process.close()

    # ------------------------------------------------------------------ the process

    def forward(self, wait_s: float = 0.0) -> list[tuple[int, int]]:
        """Send the controller what the evaluation process answered; returns the (epoch,
        version) pairs it finished (answered or abandoned). A dead process: evaluations run
        inline from now on, and its pending request is asked again by the controller."""
        finished = []
        for answer in self.process.take(wait_s):
            if isinstance(answer, Evaluated):
                self.report(answer.result, answer.version, answer.epoch, answer.held_epoch)
            else:
                log.warning(
                    "generator[%d]: evaluation of v%d abandoned", self.generator_id, answer.version
                )
                if self.dispatched == (answer.epoch, answer.version):  # else a newer ask is out
                    self.dispatched = self.evaluated  # the controller asks again
            finished.append((answer.epoch, answer.version))
        # A report goes to the controller once its served scores are in, and those come in
        # through ``pump``: the loop pumps between calls, but the drain (``_ask_due``,
        # ``_final_in_process``) waits here alone, and without it the controller asked for
        # the same evaluation until ``stop_at`` (2 minutes at the end of every served-reward
        # run).
        self.delivery.pump()
        if self.process.exited():
            log.error(
                "generator[%d]: the evaluation process exited (%s); evaluating here",
                self.generator_id,
                self.process.exitcode,
            )
            self.process = NoProcess()
            self.dispatched = self.evaluated
        return finished

    def _ask_due(self, stop_at: float) -> None:
        """The evaluations the controller still has due when the run stops (a fast run can
        outpace the evaluation process): asked one at a time, the oldest first, as in the
        loop, until none is due or ``stop_at``. Inline: none (the loop answered each ask)."""
        while self.process.in_process and time.monotonic() < stop_at:
            directives = self.admission.request(0).parts()[1]
            asked = (directives.eval_epoch, directives.eval_version)
            if directives.eval_version < 0:
                return
            if self._new(asked) and not self._hand_over(asked):
                return
            self.forward(wait_s=0.5)

    def _new(self, asked: tuple[int, int]) -> bool:
        """``asked`` (epoch, version) is neither answered nor in flight."""
        return asked > max(self.evaluated, self.dispatched)

    def _hand_over(self, asked: tuple[int, int]) -> bool:
        """Ask the process for ``asked`` (the first evaluation also in the unseen wording);
        False if there is none to take it (inline)."""
        first = self.evaluated[1] < 0
        if not self.process.ask(asked[1], asked[0], final=False, unseen=first):
            return False
        self.dispatched = asked
        return True

    def _final_in_process(self, final: tuple[int, int], stop_at: float) -> bool:
        """The final evaluation by the evaluation process (the run's other roles are done: it
        has the cores); False if there is none or it did not answer by ``stop_at``."""
        if not self.process.ask(final[1], final[0], final=True, unseen=True):
            return False
        while time.monotonic() < stop_at and self.process.in_process:
            if final in self.forward(wait_s=0.5):
                return self.evaluated == final
        return False

    # ------------------------------------------------------------------ inline

    def evaluate(self, version: int, epoch: int, final: bool = False) -> None:
        """Held-out evaluation in this loop on weights >= ``version`` of learner epoch
        ``epoch`` (``streamrl.evaluation``); its responses go to the controller as figures,
        never to the buffer. The first and the ``final`` one also ask the questions in a
        wording training never uses (``eval.unseen_phrasing``). Not run if those weights
        cannot come (the run stopped, or the learners restarted meanwhile: the controller
        asks again)."""
        from streamrl.workers.generation.evaluator import evaluate_held_out

        eval_set = self.held_out()
        stop_at = time.monotonic() + self.config.run.drain_timeout_s
        watch = None if final else self.run_goes_on
        weights, engine = self.weights, self.weights.engine
        if not weights.wait_for_version(version, stop_at, watch, epoch=epoch):
            log.warning(
                "generator[%d]: evaluation of version %d (epoch %d) abandoned: holding %d "
                "(epoch %d)",
                self.generator_id,
                version,
                epoch,
                engine.version,
                weights.held_epoch,
            )
            return
        unseen = final or self.evaluated[1] < 0
        result = evaluate_held_out(engine, self.tokenizer, self.config, eval_set, unseen)
        self.report(result, version, epoch, weights.held_epoch)

    def held_out(self) -> list[Prompt]:
        """The run's held-out prompts (``evaluation.eval_prompts``), read when first needed."""
        if self.eval_set is None:
            from streamrl.evaluation import eval_prompts

            self.eval_set = eval_prompts(self.config)
        return self.eval_set

    # ------------------------------------------------------------------ reporting

    def report(self, result: EvalResult, version: int, epoch: int, held: int) -> None:
        """Send the controller an evaluation of ``version`` (asked for in learner epoch
        ``epoch``; ``held``: the epoch of the weights evaluated), with the served rewards'
        view of its responses: then it goes when their scores come in, while this generator
        samples on (at once without served rewards)."""
        self.evaluated = max(self.evaluated, (epoch, version))
        report = EvalReport(
            self.generator_id, version, result.version, result.metrics, time.time(), held
        )
        # The held-out set is read for the questions only when scored: evaluated in the
        # evaluation process, the responses come back to a generator that never loaded it.
        self.delivery.score_responses(
            result.samples, self._questions, functools.partial(self._scored, report, result)
        )

    def _label(self, reward: int) -> str:
        return self.config.rewards[reward].display_name()

    def _questions(self) -> dict[str, str]:
        return {p.prompt_id: p.question for p in self.held_out()}

    def _scored(self, report: EvalReport, result: EvalResult, scored: Served) -> None:
        """``report`` with the served rewards' view beside the rules' exact check:
        ``eval/reward/<label>`` (the mean raw score) and ``.../unparsable``, and the answers
        it keeps (``eval_answers.keep``). An RLHF job reads the model reward and the true
        accuracy side by side here."""
        for reward, (scores, _identity) in scored.items():
            label = self._label(reward)
            present = [s for s in scores if s is not None]
            if present:
                report.metrics[f"eval/reward/{label}"] = sum(present) / len(present)
            report.metrics[f"eval/reward/{label}/unparsable"] = float(len(scores) - len(present))
        report.answers = eval_answers.keep(
            result.samples,
            self._questions,
            {reward: scores for reward, (scores, _identity) in scored.items()},
            self._label,
            self.config.eval.keep_answers,
        )
        self.reporting.send_eval(report)
        log.info(
            "generator[%d]: evaluated version %d: %s",
            self.generator_id,
            report.version,
            report.metrics,
        )


def evaluations_for(
    spec: GeneratorSpec,
    *,
    tokenizer: object,
    weights: GeneratorWeights,
    reporting: Reporting,
    delivery: Delivery,
    admission: Admission,
    run_goes_on: Callable[[], bool],
) -> Evaluations:
    """Generator 0's part when the run evaluates (its evaluation process started now, so
    that its engine loads while generator 0 samples); ``NoEvaluations`` for the others."""
    config = spec.config
    if spec.generator_id != 0 or config.eval.every <= 0:
        return NoEvaluations()
    process: EvalProcess = SlackEvaluator(spec) if evaluates_in_slack(config) else NoProcess()
    return HeldOutEvaluations(
        config,
        spec.generator_id,
        tokenizer=tokenizer,
        weights=weights,
        reporting=reporting,
        delivery=delivery,
        admission=admission,
        run_goes_on=run_goes_on,
        process=process,
    )
