"""Useful generation (``controller.generation_yield``): the generators' tokens against what the
shards say became of them; every token is in exactly one place."""

from __future__ import annotations

from streamrl.controller.generation_yield import LOSSES, generation_yield
from streamrl.controller.records import outcome
from streamrl.protocol import GeneratorReport, ShardStats


def _generator(gid: int, tokens: int) -> GeneratorReport:
    return GeneratorReport(gid, 0, tokens, 0, 0, 0, 0.0)


def _shard(sid: int, fates: dict[str, int], stored: int) -> ShardStats:
    return ShardStats(sid, 0, 8, 0, 0, {}, 0, tokens_by_fate=fates, stored_policy_tokens=stored)


def test_every_generated_token_is_trained_or_lost_for_one_reason() -> None:
    shards = [
        _shard(0, {"trained": 200, "zero_variance": 400, "dead_timeline": 5}, 10),
        _shard(1, {"trained": 140, "zero_variance": 200, "stale": 5, "too_large": 20}, 10),
    ]
    guided = _generator(1, 400)
    guided.guidance_tokens_displaced = 4  # samples a reference response took the place of
    guided.groups_guided = 2
    y = generation_yield([_generator(0, 600), guided], shards)
    assert y.generated == 1000 and y.trained == 340 and y.useful == 0.34
    assert y.lost == {
        "zero_variance": 600,
        "probe": 0,
        "guidance": 4,
        "stale": 10,
        "filtered": 20,
        "in_buffer": 20,
        "refused": 6,  # generated, never reached a shard (refused at the generator)
    }
    assert y.trained + sum(y.lost.values()) == y.generated
    record = y.record()
    assert record["generation/useful"] == 0.34 and record["generation/lost/zero_variance"] == 0.6
    assert set(y.summary()["lost"]) == set(LOSSES)
    assert y.groups_guided == 2 and record["generation/groups_guided_total"] == 2


def test_a_shard_ahead_of_the_generators_reports_never_makes_a_negative_loss() -> None:
    y = generation_yield([_generator(0, 50)], [_shard(0, {"trained": 80}, 0)])
    assert y.generated == 80 and y.lost["refused"] == 0 and y.useful == 1.0
    empty = generation_yield([], [])
    assert empty.useful == 0.0 and empty.summary()["tokens"] == 0


def test_the_closing_lines_say_how_much_generation_was_useful() -> None:
    shard = _shard(0, {"trained": 340, "zero_variance": 660}, 0)
    y = generation_yield([_generator(0, 1000)], [shard])
    text = outcome({"wall_time_s": 10.0, "version": 3, "eval": [], "generation": y.summary()})
    assert "useful generation 34% of 1000 tokens (lost: zero variance 66%)\n" in text + "\n"
    guided = y.summary() | {"groups_guided": 12}
    text = outcome({"wall_time_s": 10.0, "version": 3, "eval": [], "generation": guided})
    assert "(lost: zero variance 66%); 12 groups trained on a reference response" in text


def test_streamrl_admin_status_shows_it() -> None:
    from streamrl.admin.client import format_status

    shard = _shard(0, {"trained": 250, "zero_variance": 750}, 0)
    y = generation_yield([_generator(0, 1000)], [shard])
    text = format_status({"run": "r", "generation": y.summary()}, now=0.0)
    lost = "lost: zero_variance 75% probe 0% guidance 0% stale 0%"
    assert f"generation: useful 25% of 1000 tokens; {lost}" in text


def test_the_unit_is_the_policy_token_not_an_environment_s() -> None:
    from streamrl.protocol import Trajectory, TrajectoryGroup

    def traj(mask: list[int] | None) -> Trajectory:
        return Trajectory.from_lists(
            [1], [2, 3, 4, 5], [-0.1] * 4, [0] * 4, 0.0, "stop", 0, action_mask=mask
        )

    assert traj(None).num_policy_tokens == 4  # single turn: every response token
    assert traj([1, 0, 0, 1]).num_policy_tokens == 2  # an episode: the environment wrote two
    assert TrajectoryGroup("g", "p", [traj(None), traj([1, 0, 0, 1])], 0.0, 0.0).policy_tokens == 6
