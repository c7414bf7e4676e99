"""Which learner reports the controller takes: the current group's, moving forward."""

from __future__ import annotations

import io

from streamrl.config import load_config
from streamrl.controller.run import Controller
from streamrl.protocol import BatchTaken, LearnerStep


def make_controller() -> Controller:
    controller = Controller(load_config(None, ["run.max_steps=10"]), console=io.StringIO())
    controller.ctx.destroy(linger=0)  # no sockets needed: reports are judged, not received
    return controller


def test_a_replaced_groups_late_reports_do_not_move_the_run_back_or_forward():
    controller = make_controller()
    state = controller.state
    state.version, state.weights_epoch = 4, 1  # the group restarted from version 4
    stale_step = LearnerStep(6, {}, 0.0, incarnation=0)  # the dead group's last step
    stale_taken = BatchTaken(0, 7, [1, 2], incarnation=0)
    assert not controller._current_learner_report(stale_step)
    assert not controller._current_learner_report(stale_taken)
    assert controller._current_learner_report(LearnerStep(5, {}, 0.0, incarnation=1))
    assert controller._current_learner_report(BatchTaken(1, 5, [3], incarnation=1))
    assert controller.ignored_reports == {
        "LearnerStep: from a replaced learner group": 1,
        "BatchTaken: from a replaced learner group": 1,
    }


def test_versions_must_move_forward_within_max_steps():
    controller = make_controller()
    controller.state.version = 3
    for version in (3, 2, 11, -1):
        assert not controller._current_learner_report(LearnerStep(version, {}, 0.0))
    assert controller._current_learner_report(LearnerStep(4, {}, 0.0))
    assert not controller._current_learner_report(BatchTaken(0, 0, []))
    assert controller.ignored_reports == {
        "LearnerStep: version out of range": 4,
        "BatchTaken: version out of range": 1,
    }
