"""A run that accepts no group says so (``controller.drops.DropWatch``), and a reward plugin
that raises is counted, not hidden (``rewards.CombinedReward.errors``)."""

from __future__ import annotations

import logging

from streamrl.config import RewardSpec
from streamrl.controller.drops import DropWatch
from streamrl.rewards import CombinedReward, RewardInput


def test_a_window_of_only_drops_is_said_once_per_window_naming_the_main_reason():
    watch = DropWatch(window_s=30, min_dropped=8)
    assert watch.observe(0, accepted=10, dropped={"zero_variance": 4}, reward_errors=0) is None
    assert watch.observe(20, accepted=10, dropped={"zero_variance": 40}, reward_errors=30) is None
    line = watch.observe(
        31, accepted=10, dropped={"zero_variance": 60, "stale": 6}, reward_errors=56
    )
    assert line == (
        "no group accepted in 31 s: 56 of 62 dropped as zero_variance "
        "(reward errors: 56; see the generators' logs)"
    )
    assert watch.observe(40, accepted=10, dropped={"zero_variance": 90}, reward_errors=56) is None
    assert watch.observe(62, accepted=10, dropped={"zero_variance": 99}, reward_errors=56)


def test_accepted_groups_or_few_drops_say_nothing():
    watch = DropWatch(window_s=10, min_dropped=8)
    watch.observe(0, accepted=0, dropped={}, reward_errors=0)
    assert watch.observe(11, accepted=1, dropped={"stale": 50}, reward_errors=0) is None
    quiet = DropWatch(window_s=10, min_dropped=8)
    quiet.observe(0, accepted=0, dropped={}, reward_errors=0)
    assert quiet.observe(11, accepted=0, dropped={"stale": 3}, reward_errors=0) is None


def broken_reward(sample: RewardInput) -> float:
    raise KeyError("the plugin's bug")


def test_a_raising_reward_scores_zero_is_counted_and_logged_once(caplog, monkeypatch):
    monkeypatch.setattr("streamrl.rewards.resolve_reward", lambda name: broken_reward)
    reward = CombinedReward([RewardSpec(name="broken")])
    sample = RewardInput("12", [1], "12", "arithmetic")
    with caplog.at_level(logging.ERROR, logger="streamrl.rewards"):
        assert [reward(sample) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert reward.errors == 3
    assert len([r for r in caplog.records if "raised" in r.getMessage()]) == 1
