"""Several rewards into one (streamrl.rewards.mix): weights and normalisation against hand
computations."""

from __future__ import annotations

import logging

import pytest

from streamrl.config import load_config
from streamrl.rewards.mix import RewardMix, impute


def test_two_scorers_weighted_with_group_normalisation_match_the_hand_computation() -> None:
    mix = RewardMix([1.0, 0.5], ["none", "group"])
    rewards, missing = mix.combine([[1.0, 0.0], [2.0, 4.0]])
    # rule kept; model: mean 3, population std 1 -> [-1, 1]; 1 + 0.5 * -1, 0 + 0.5 * 1
    assert rewards == pytest.approx([0.5, 0.5])
    assert missing == [0, 0]


def test_running_normalises_within_the_group_whatever_came_before() -> None:
    """Issue 52: ``running`` kept its statistics per generator process, so one group's
    rewards depended on what that process had scored before (another generator, or the same
    after a restart, gave the same scores other rewards). Now a group's rewards are a
    function of its own scores: as ``group`` normalises them, in any process, in any order."""
    seasoned, fresh = RewardMix([2.0], ["running"]), RewardMix([2.0], ["running"])
    for scores in ([1.0, 3.0], [10.0, 30.0], [0.0, 0.5]):
        seasoned.combine([scores])
    second, _ = seasoned.combine([[5.0, 7.0]])
    assert second == fresh.combine([[5.0, 7.0]])[0] == pytest.approx([-2.0, 2.0])
    assert second == RewardMix([2.0], ["group"]).combine([[5.0, 7.0]])[0]


def test_a_running_reward_is_warned_about_when_the_config_loads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="streamrl.config"):
        config = load_config(None, ["rewards=[{name: numeric_match, normalize: running}]"])
    assert config.rewards[0].normalize == "running"  # a config that says running still loads
    assert any("normalised within each group" in r.getMessage() for r in caplog.records)


def test_an_unscorable_response_is_imputed_with_its_group_mean_and_counted() -> None:
    mix = RewardMix([1.0, 1.0], ["none", "none"])
    rewards, missing = mix.combine([[1.0, 0.0, 1.0], [0.2, None, 0.8]])
    assert missing == [0, 1]
    assert rewards == pytest.approx([1.2, 0.5, 1.8])  # the None is the mean 0.5, not 0


def test_a_group_with_no_scores_from_a_reward_adds_nothing_from_it() -> None:
    assert impute([None, None]) == ([0.0, 0.0], 2)
    mix = RewardMix([1.0, 1.0], ["none", "group"])
    rewards, missing = mix.combine([[1.0, 0.0], [None, None]])
    assert rewards == pytest.approx([1.0, 0.0]) and missing == [0, 2]


def test_a_constant_group_normalises_to_zero() -> None:
    mix = RewardMix([1.0], ["group"])
    assert mix.combine([[0.7, 0.7, 0.7]])[0] == [0.0, 0.0, 0.0]


def test_the_plain_job_is_one_unnormalised_reward() -> None:
    assert RewardMix([0.5], ["none"]).plain
    assert not RewardMix([0.5], ["group"]).plain
    assert not RewardMix([1.0, 1.0], ["none", "none"]).plain


def test_mismatched_shapes_are_refused() -> None:
    with pytest.raises(ValueError):
        RewardMix([1.0], ["none", "group"])
    with pytest.raises(ValueError):
        RewardMix([1.0, 1.0], ["none", "none"]).combine([[1.0, 2.0], [1.0]])
