"""The learner clock's one rule (``streamrl.clock``), and the replay store following it."""

from __future__ import annotations

from streamrl.buffers.replay import Offer, ReplayPolicy, ReplayStore
from streamrl.clock import LearnerClock
from streamrl.controller.state import PromptLedger
from streamrl.protocol import Trajectory, TrajectoryGroup


def group(gid: str, versions: list[int], epoch: int = 0) -> TrajectoryGroup:
    trajectories = [
        Trajectory.from_lists(
            [1], [2] * len(versions), [-0.1] * len(versions), versions, r, "stop", 0
        )
        for r in (0.0, 1.0)
    ]
    return TrajectoryGroup(gid, gid, trajectories, 0.0, 0.0, weights_epoch=epoch)


def test_a_higher_epoch_replaces_the_same_takes_the_max_a_lower_is_ignored():
    clock = LearnerClock()
    assert not clock.observe(0, 11)
    assert (clock.epoch, clock.version) == (0, 11)
    assert clock.observe(1, 8, [8])  # the group restarted from step 8: the version goes down
    assert (clock.epoch, clock.version, clock.forks) == (1, 8, [8])
    assert not clock.observe(0, 12)  # a late request of the replaced group
    assert (clock.epoch, clock.version) == (1, 8)
    assert not clock.observe(1, 7)
    assert clock.version == 8
    assert not clock.observe(1, 9)
    assert clock.version == 9


def test_on_timeline_keeps_an_old_epoch_up_to_its_fork_only():
    clock = LearnerClock(2, 10, [8, 9])
    assert clock.on_timeline(2, 50) and clock.on_timeline(3, 0)  # current or newer: kept
    assert clock.on_timeline(0, 8) and not clock.on_timeline(0, 9)
    assert clock.on_timeline(1, 9) and not clock.on_timeline(1, 10)
    # A resume without a checkpoint forks at -1: nothing of the old epoch is kept, not even v0.
    restarted = LearnerClock(1, 0, [-1])
    assert not restarted.on_timeline(0, 0) and restarted.on_timeline(1, 0)
    # A reader that never heard the forks keeps nothing of older epochs.
    blind = LearnerClock()
    blind.observe(2, 10)
    assert not blind.on_timeline(0, 0) and blind.on_timeline(2, 0)


def test_the_store_refuses_and_evicts_groups_off_the_timeline():
    clock = LearnerClock(0, 11)
    store: ReplayStore[TrajectoryGroup] = ReplayStore(ReplayPolicy(max_staleness=4), clock)
    assert store.offer(group("early", [8], 0)) is Offer.ACCEPTED
    assert store.offer(group("dead", [9, 11], 0)) is Offer.ACCEPTED
    assert clock.observe(1, 8, [8])
    assert store.evict_off_timeline() == 1
    assert [g.group_id for g in store.pending()] == ["early"]
    # Arriving late from the dead timeline: refused and counted; the new epoch's are fresh.
    assert store.offer(group("late", [10], 0)) is Offer.DEAD_TIMELINE
    assert store.offer(group("new", [8], 1)) is Offer.ACCEPTED
    assert store.stats()["dropped"]["dead_timeline"] == 2
    # What livelocked before the clock: the shard's version follows the restart down, so
    # groups of versions 8.. are not stale against the dead timeline's 11.
    assert [g.group_id for g in store.take(2)] == ["early", "new"]


def test_roll_back_hands_out_reported_and_receipted_prompts_once_each():
    ledger = PromptLedger(next_index=10)
    ledger.taken(9, [1, 2])
    ledger.taken(8, [0])
    again = ledger.roll_back(8, extra=[2, 3])  # 3: a take whose report never came
    assert again == [1, 2, 3]
    assert ledger.grant(0, 4) == [1, 2, 3, 10]
