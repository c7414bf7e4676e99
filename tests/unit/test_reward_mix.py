"""Several rewards into one (streamrl.reward_mix): weights and normalisation against hand
computations."""

from __future__ import annotations

import math

import pytest

from streamrl.reward_mix import RewardMix, RunningStats, impute


def test_two_scorers_weighted_with_group_normalisation_match_the_hand_computation() -> None:
    mix = RewardMix([1.0, 0.5], ["none", "group"])
    rewards, missing = mix.combine([[1.0, 0.0], [2.0, 4.0]])
    # rule kept; model: mean 3, population std 1 -> [-1, 1]; 1 + 0.5 * -1, 0 + 0.5 * 1
    assert rewards == pytest.approx([0.5, 0.5])
    assert missing == [0, 0]


def test_running_normalisation_uses_every_score_seen_so_far() -> None:
    mix = RewardMix([2.0], ["running"])
    first, _ = mix.combine([[1.0, 3.0]])  # mean 2, std 1
    assert first == pytest.approx([-2.0, 2.0])
    second, _ = mix.combine([[5.0, 7.0]])  # seen 1, 3, 5, 7: mean 4, std sqrt(5)
    std = math.sqrt(5.0)
    assert second == pytest.approx([2.0 * (5 - 4) / std, 2.0 * (7 - 4) / std])


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


def test_running_stats_match_the_population_figures() -> None:
    stats = RunningStats()
    for v in [2, 4, 4, 4, 5, 5, 7, 9]:
        stats.add(v)
    assert stats.mean == pytest.approx(5.0) and stats.std == pytest.approx(2.0)


def test_the_plain_job_is_one_unnormalised_reward() -> None:
    assert RewardMix([0.5], ["none"]).plain
    assert not RewardMix([0.5], ["group"]).plain
    assert not RewardMix([1.0, 1.0], ["none", "none"]).plain


def test_mismatched_shapes_are_refused() -> None:
    with pytest.raises(ValueError):
        RewardMix([1.0], ["none", "group"])
    with pytest.raises(ValueError):
        RewardMix([1.0, 1.0], ["none", "none"]).combine([[1.0, 2.0], [1.0]])
