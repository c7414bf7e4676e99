"""Generator 0's evaluations when the run stops (workers.generation.generator_evaluations):
an evaluation the process answered reaches the controller while the run drains, also when
its report waits for served scores, which come in only through the delivery's ``pump``."""

from __future__ import annotations

import time
from types import SimpleNamespace

from streamrl.config import Config
from streamrl.evaluation import EvalResult
from streamrl.protocol import Directives
from streamrl.workers.generation.eval_process import Evaluated
from streamrl.workers.generation.generator_evaluations import HeldOutEvaluations


class _Controller:
    """Asks for version 0 until a report of it arrives (the admission reply's directive)."""

    def __init__(self) -> None:
        self.reports: list = []
        self.asked = 0

    def request(self, _n: int):
        self.asked += 1
        due = -1 if self.reports else 0
        return SimpleNamespace(parts=lambda: (None, Directives(eval_version=due), None, None))

    def send_eval(self, report) -> None:
        self.reports.append(report)


class _Process:
    """An evaluation process that answers each ask at once."""

    in_process = True
    exitcode = None

    def __init__(self) -> None:
        self.answers: list[Evaluated] = []

    def ask(self, version: int, epoch: int, final: bool, unseen: bool) -> bool:
        self.answers.append(Evaluated(version, epoch, EvalResult(version, {}, []), epoch))
        return True

    def take(self, timeout_s: float = 0.0) -> list[Evaluated]:
        answers, self.answers = self.answers, []
        return answers

    def exited(self) -> bool:
        return False


class _ServedDelivery:
    """Served rewards: a report's callback runs from a later ``pump``, as GroupScoring's."""

    def __init__(self) -> None:
        self.waiting: list = []

    def score_responses(self, samples, questions, done) -> None:
        self.waiting.append(done)

    def pump(self, wait_ms: int = 0) -> None:
        waiting, self.waiting = self.waiting, []
        for done in waiting:
            done({})


def test_an_evaluation_due_at_the_end_is_reported_through_served_scoring() -> None:
    controller = _Controller()
    weights = SimpleNamespace(held_epoch=0, engine=SimpleNamespace(version=0))
    evaluations = HeldOutEvaluations(
        Config(),
        0,
        tokenizer=None,
        weights=weights,
        reporting=controller,
        delivery=_ServedDelivery(),
        admission=controller,
        run_goes_on=lambda: True,
        process=_Process(),
    )
    evaluations._questions = lambda: {}  # no held-out set to read
    stop_at = time.monotonic() + 30
    evaluations.finish(stop_at)
    assert [r.version for r in controller.reports] == [0]
    # The controller heard the report and stopped asking: the drain did not wait out stop_at.
    assert controller.asked <= 3 and time.monotonic() < stop_at
