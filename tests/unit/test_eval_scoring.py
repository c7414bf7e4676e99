"""Held-out evaluation's served scores never hold generator 0 (``HeldOutEvaluations.report``
through its ``Delivery`` with the real scoring client and a ROUTER standing in for the reward
role): the call returns at once, the generator's groups settle meanwhile, and the
``EvalReport`` goes once, with the model's view, when its scores come in."""

from __future__ import annotations

import time
from types import SimpleNamespace

import zmq
from test_scoring_client import _group, _pump_until, _Role

from streamrl.config import Config, RewardSpec, ScoringConfig
from streamrl.evaluation import EvalResult
from streamrl.workers.generation.generator_delivery import Delivery
from streamrl.workers.generation.generator_evaluations import HeldOutEvaluations, NoProcess
from streamrl.workers.generation.generator_sockets import ShardPushers
from streamrl.workers.generation.scoring import GroupScoring


def _evaluations(ctx: zmq.Context, role: _Role, sent: list) -> HeldOutEvaluations:
    """Generator 0's evaluations with only the parts reporting uses: a reward model served
    by ``role`` (its delivery's scoring), its ``EvalReport``s appended to ``sent``, no
    held-out set loaded yet."""
    config = Config(
        rewards=[RewardSpec(model="/models/rm", label="rm")],
        scoring=ScoringConfig(timeout_s=30),
    )
    scoring = GroupScoring(
        ctx, config, {0: role.endpoint}, "gen-0", lambda g: "q", lambda g, served: None
    )
    return HeldOutEvaluations(
        config,
        0,
        tokenizer=None,
        weights=None,
        reporting=SimpleNamespace(send_eval=sent.append),
        delivery=Delivery(ShardPushers([], "gen-0", 0), scoring),
        admission=None,
        run_goes_on=lambda: True,
        process=NoProcess(),
    )


def _sample(prompt_id: str, response: str, truth: str) -> dict:
    """One response as ``evaluation.score`` makes it."""
    return {
        "prompt_id": prompt_id,
        "response": response,
        "ground_truth": truth,
        "reward": 0.0,
        "exact": False,
        "stopped": True,
    }


def test_an_evaluation_s_scores_do_not_hold_the_generator() -> None:
    ctx = zmq.Context()
    role = _Role(ctx)
    sent: list = []
    evaluations = _evaluations(ctx, role, sent)
    evaluations.eval_set = [SimpleNamespace(prompt_id="e0", question="2+2?")]
    try:
        evaluations.delivery.scoring.submit([_group(1)])
        samples = [_sample("e0", "four", "4")]
        started = time.monotonic()
        evaluations.report(EvalResult(7, {"eval/accuracy": 1.0}, samples), 7, 0, 0)
        assert time.monotonic() - started < 0.1  # returned without waiting for the role
        assert evaluations.evaluated == (0, 7) and sent == []  # asked once, reported later
        requests = {r.items[0].prompt: (p, r) for p, r in role.take(2)}
        role.answer(*requests["q"])  # the group's scores come first: it settles meanwhile
        assert [g.prompt_index for g in _pump_until(evaluations.delivery.scoring, 1)] == [1]
        assert sent == []
        role.answer(*requests["2+2?"])
        deadline = time.monotonic() + 5
        while not sent and time.monotonic() < deadline:
            evaluations.delivery.scoring.pump(wait_ms=20)
        (report,) = sent
        assert report.version == 7 and report.metrics["eval/accuracy"] == 1.0
        assert report.metrics["eval/reward/rm"] == 4.0  # len("four") from the stand-in
        assert report.metrics["eval/reward/rm/unparsable"] == 0.0
        assert evaluations.delivery.scoring.pending == 0
        # What the model answered goes with it: question, response, rules' and served scores.
        (answer,) = report.answers
        assert (answer.prompt_id, answer.question, answer.response) == ("e0", "2+2?", "four")
        assert answer.served == {"rm": 4.0} and answer.exact is False
    finally:
        evaluations.delivery.scoring.close()
        ctx.destroy(linger=0)


def test_an_evaluation_made_in_the_evaluation_process_is_scored_by_generator_0() -> None:
    """Generator 0 of a run with served rewards whose evaluations run in its evaluation
    process never loaded the held-out set itself: it reads it to show the role the questions
    (it failed with a bare AssertionError, four times, and the RLHF job's run with it)."""
    ctx = zmq.Context()
    role = _Role(ctx)
    sent: list = []
    evaluations = _evaluations(ctx, role, sent)  # the evaluation process evaluated
    try:
        held = evaluations.held_out()
        samples = [_sample(held[0].prompt_id, "four", "4")]
        evaluations.report(EvalResult(3, {"eval/accuracy": 0.5}, samples), 3, 0, 0)
        ((peer, request),) = role.take(1)
        assert request.items[0].prompt == held[0].question != ""
        role.answer(peer, request)
        deadline = time.monotonic() + 5
        while not sent and time.monotonic() < deadline:
            evaluations.delivery.scoring.pump(wait_ms=20)
        (report,) = sent
        assert report.metrics["eval/reward/rm"] == 4.0
    finally:
        evaluations.delivery.scoring.close()
        ctx.destroy(linger=0)
