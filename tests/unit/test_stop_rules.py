"""Early stopping (``controller.stopping``): a run ends when nothing is left to learn."""

from __future__ import annotations

import pytest

from streamrl.config import ConfigError, load_config
from streamrl.controller.state import RunState
from streamrl.controller.stopping import StopRules, rules_for
from streamrl.protocol import ShardStats


def test_patience_counts_evaluations_without_a_gain_over_the_best():
    rules = StopRules(patience=3, metric="eval/completed", min_delta=0.01, starved_s=0)
    seen = [rules.evaluated({"eval/completed": v}) for v in (0.1, 0.5, 0.505, 0.4, 0.6)]
    assert seen == [None] * 5  # 0.505 is within min_delta: 1, 0.4: 2, 0.6: a new best
    assert rules.evaluated({"eval/completed": 0.6}) is None
    assert rules.evaluated({"eval/completed": 0.55}) is None
    reason = rules.evaluated({"eval/completed": 0.61})
    assert reason is not None and "over 3 evaluations" in reason and "best 0.600" in reason


def test_patience_off_or_a_metric_the_evaluation_lacks_never_stops():
    off = StopRules(patience=0, metric="eval/completed", min_delta=0.0, starved_s=0)
    assert all(off.evaluated({"eval/completed": 0.0}) is None for _ in range(10))
    other = StopRules(patience=1, metric="eval/success", min_delta=0.0, starved_s=0)
    assert all(other.evaluated({"eval/completed": 0.0}) is None for _ in range(10))


def test_a_fall_below_the_best_stops_an_over_optimising_run():
    """The RLHF job's rule check rose to its best, then fell while the reward model's score
    kept rising: the rule stops the run once the fall exceeds eval.stop_below_best."""
    rules = StopRules(0, "eval/exact_match", 0.0, 0, below_best=0.1)
    seen = [rules.evaluated({"eval/exact_match": v}) for v in (0.05, 0.25, 0.2, 0.16, 0.3)]
    assert seen == [None] * 5  # 0.16 is 0.09 below 0.25; 0.3 is a new best
    reason = rules.evaluated({"eval/exact_match": 0.15})
    assert (
        reason == "eval/exact_match 0.150 is 0.150 below its best 0.300 (eval.stop_below_best=0.1)"
    )
    off = StopRules(0, "eval/exact_match", 0.0, 0)
    assert all(off.evaluated({"eval/exact_match": v}) is None for v in (0.9, 0.0))


def test_starvation_is_groups_arriving_and_none_accepted_for_the_window():
    rules = StopRules(patience=0, metric="", min_delta=0.0, starved_s=30)
    state = RunState()

    def shard(received: int, dropped: int) -> ShardStats:
        return ShardStats(0, 0, 64, received, 0, {"zero_variance": dropped}, 0)

    state.shards = {0: shard(10, 0)}
    assert rules.starved(0.0, state) is None
    state.shards = {0: shard(20, 10)}
    assert rules.starved(20.0, state) is None  # not yet a whole window
    state.shards = {0: shard(30, 20)}
    reason = rules.starved(31.0, state)
    assert reason is not None and reason.startswith("starved: no group accepted in 31 s")
    assert "dropped as zero_variance" in reason


def test_the_metric_follows_the_job_and_bad_settings_are_one_line():
    assert rules_for(load_config("calculator")).metric == "eval/success"
    assert rules_for(load_config("default")).metric == "eval/completed"
    # The calculator job stops on patience; without evaluations (e.g. `bench throughput`,
    # which also turns both rules off) there is nothing to count.
    assert load_config("calculator", ["eval.every=0"]).eval.patience == 1
    with pytest.raises(ConfigError, match="eval.patience must be >= 0"):
        load_config("tiny", ["eval.patience=-1"])
    with pytest.raises(ConfigError, match="run.stop_when_starved_s must be >= 0"):
        load_config("tiny", ["run.stop_when_starved_s=-1"])
