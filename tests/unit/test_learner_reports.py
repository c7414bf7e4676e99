"""Which learner reports the controller's intake takes: the current group's, moving forward.
No controller and no sockets: reports are judged, not received."""

from __future__ import annotations

from streamrl.controller.intake import ReportIntake
from streamrl.controller.state import RunState
from streamrl.protocol import BatchTaken, LearnerStep


def make_controller() -> ReportIntake:
    return ReportIntake(RunState(), max_steps=10, eval_every=0)


def test_a_replaced_groups_late_reports_do_not_move_the_run_back_or_forward():
    controller = make_controller()
    state = controller.state
    state.version, state.weights_epoch = 4, 1  # the group restarted from version 4
    stale_step = LearnerStep(6, {}, 0.0, incarnation=0)  # the dead group's last step
    stale_taken = BatchTaken(0, 7, [1, 2], incarnation=0)
    assert not controller.current_learner_report(stale_step)
    assert not controller.current_learner_report(stale_taken)
    assert controller.current_learner_report(LearnerStep(5, {}, 0.0, incarnation=1))
    assert controller.current_learner_report(BatchTaken(1, 5, [3], incarnation=1))
    assert controller.ignored == {
        "LearnerStep: from a replaced learner group": 1,
        "BatchTaken: from a replaced learner group": 1,
    }


def test_versions_must_move_forward_within_max_steps():
    controller = make_controller()
    controller.state.version = 3
    for version in (3, 2, 11, -1):
        assert not controller.current_learner_report(LearnerStep(version, {}, 0.0))
    assert controller.current_learner_report(LearnerStep(4, {}, 0.0))
    assert not controller.current_learner_report(BatchTaken(0, 0, []))
    assert controller.ignored == {
        "LearnerStep: version out of range": 4,
        "BatchTaken: version out of range": 1,
    }


def test_a_taken_step_moves_the_version_prunes_at_checkpoints_and_asks_for_evals():
    state = RunState()
    intake = ReportIntake(state, max_steps=10, eval_every=2)
    intake.apply(BatchTaken(0, 1, [5, 6]))
    intake.apply(BatchTaken(0, 2, [7]))
    intake.apply(LearnerStep(1, {}, 1.0))
    intake.apply(LearnerStep(2, {"checkpoint/version": 2.0}, 2.0))
    assert state.version == 2 and state.eval_requested == 2
    assert state.prompts.trained == {}  # step 2's checkpoint holds steps 1 and 2
    assert [s.version for s in intake.take_steps()] == [1, 2] and intake.take_steps() == []
