"""The learner clock across incarnations, as the controller keeps it: a ``--resume`` is a new
epoch, evaluations follow the epoch, and records are read on the live timeline only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamrl.clock import live_records
from streamrl.controller.intake import ReportIntake
from streamrl.controller.rundir import RunError, load_clock, resume_clock, save_clock
from streamrl.controller.state import RunState
from streamrl.protocol import EvalReport, LearnerStep


def test_a_resume_starts_one_epoch_above_the_newest_forked_at_its_checkpoint(tmp_path: Path):
    assert resume_clock(tmp_path, 12) == (1, [12])  # a run of epoch 0 only
    # Epoch 1 started at 8 (a learner restart), reached 14, checkpointed 12, then died.
    save_clock(tmp_path, 1, [8])
    assert load_clock(tmp_path) == (1, [8])
    assert resume_clock(tmp_path, 12) == (2, [8, 12])
    # Restarted again (epoch 2 at 12) and killed before a new checkpoint: the resume must go
    # above epoch 2, whose groups the logs may hold, though the checkpoint says epoch 1.
    save_clock(tmp_path, 2, [8, 12])
    assert resume_clock(tmp_path, 12, {"epoch": 1, "forks": [8]}) == (3, [8, 12, 12])
    # No checkpoint at all: nothing of any earlier epoch is kept.
    assert resume_clock(tmp_path, None) == (3, [8, 12, -1])


def test_a_run_dir_without_clock_json_resumes_above_its_checkpoint_s_epoch(tmp_path: Path):
    assert resume_clock(tmp_path, 10, {"epoch": 2, "forks": [4, 7]}) == (3, [4, 7, 10])


def test_an_unreadable_clock_refuses_to_resume_in_one_line(tmp_path: Path):
    (tmp_path / "clock.json").write_text('{"epoch": 2, "forks": [1]}')
    with pytest.raises(RunError, match="2 forks|1 forks"):
        load_clock(tmp_path)


def _eval(version: int, epoch: int, requested: int | None = None) -> EvalReport:
    requested = version if requested is None else requested
    return EvalReport(0, requested, version, {"eval/exact_match": 0.5}, 1.0, epoch)


def test_a_restart_forgets_evaluations_of_weights_it_took_back():
    state = RunState()
    state.eval_requested, state.eval_answered = 20, 20  # epoch 0's v20, evaluated
    state.learners_restarted(15, [15], [], groups_per_step=2)
    assert (state.eval_requested, state.eval_answered) == (15, 15)  # nothing pending
    step = LearnerStep(20, {}, 0.0, incarnation=1)
    state.learner_stepped(step, eval_every=10, max_steps=40)
    assert state.eval_requested == 20 > state.eval_answered  # the live v20 is asked for
    assert not state.eval_is_live(_eval(20, 0))  # epoch 0's v20 is gone
    assert state.eval_is_live(_eval(10, 0)) and state.eval_is_live(_eval(20, 1))


def test_an_evaluation_of_dead_weights_is_counted_not_taken():
    state = RunState()
    taken: list[EvalReport] = []
    intake = ReportIntake(state, max_steps=40, eval_every=10, on_eval=taken.append)
    state.eval_requested = 20
    state.learners_restarted(15, [15], [], groups_per_step=2)
    intake.apply(_eval(20, 0))  # generator 0 evaluated epoch 0's v20 before it heard
    assert taken == [] and state.eval_answered < 20
    assert intake.ignored == {"EvalReport: of weights off the timeline": 1}
    intake.apply(_eval(20, 1))
    assert taken == [_eval(20, 1)] and state.eval_answered == 20


def test_without_a_checkpoint_the_prompt_record_keeps_only_unreported_steps():
    """Issue 40 item 7: the ledger was rewritten whole every step with every step's prompts
    (quadratic over a run) though no resume could use them without a checkpoint."""
    state = RunState()
    for version in range(1, 101):
        state.prompts.taken(version, [2 * version, 2 * version + 1])
        state.prompts.taken(version + 1, [-1])  # a rank's take for the next step, early
        state.learner_stepped(LearnerStep(version, {}, 0.0), eval_every=0, max_steps=200)
    assert set(state.prompts.trained) == {101}
    checkpoint = LearnerStep(101, {"checkpoint/version": 101.0}, 0.0)
    state.learner_stepped(checkpoint, eval_every=0, max_steps=200)
    for version in (102, 103):
        state.prompts.taken(version, [version])
        state.learner_stepped(LearnerStep(version, {}, 0.0), eval_every=0, max_steps=200)
    assert set(state.prompts.trained) == {102, 103}  # what a resume at 101 hands out again


def test_records_are_read_on_the_live_timeline():
    lines = [
        {"event": "epoch", "epoch": 0, "forks": []},
        *({"step": v, "epoch": 0, "reward/mean": 0.1 * v} for v in range(1, 13)),
        {"event": "eval", "epoch": 0, "requested": 10, "eval/version": 10.0},
        {"event": "eval", "epoch": 0, "requested": 12, "eval/version": 12.0},
        {"event": "epoch", "epoch": 1, "forks": [10]},  # resumed at checkpoint 10
        *({"step": v, "epoch": 1} for v in range(11, 15)),
        {"event": "eval", "epoch": 1, "requested": 12, "eval/version": 12.0},
    ]
    live = live_records(json.loads(json.dumps(lines)))
    steps = [(r["epoch"], r["step"]) for r in live if "step" in r]
    assert steps == [(0, v) for v in range(1, 11)] + [(1, v) for v in range(11, 15)]
    evals = [(r["epoch"], r["requested"]) for r in live if r.get("event") == "eval"]
    assert evals == [(0, 10), (1, 12)]
    old = [{"step": 1}, {"event": "eval", "requested": 0}]  # written before records had epochs
    assert live_records(old) == old
