"""ReplayStore: admission, staleness eviction, reuse, sampling orders, overflow, live reconfig.

The store depends only on a version provider, faked here by a settable attribute.
"""

from __future__ import annotations

from functools import partial

import pytest
from support import ids
from support import make_group as any_group

from streamrl.buffers.replay import Offer, ReplayPolicy, ReplayStore
from streamrl.protocol import pack_int32

# Groups of 4-token trajectories: the token figures below count them.
make_group = partial(any_group, tokens=4)


class FakeVersions:
    def __init__(self, version: int = 0) -> None:
        self.version = version

    def current_version(self) -> int:
        return self.version

    def on_timeline(self, epoch: int, max_version: int) -> bool:
        return True


def make_store(versions: FakeVersions | None = None, **policy) -> ReplayStore:
    return ReplayStore(ReplayPolicy(**policy), versions or FakeVersions(), seed=0)


def assert_accounted(store: ReplayStore) -> None:
    """Every offer ended in exactly one place."""
    s = store.stats()
    assert s["offered"] == s["size"] + s["retired"] + sum(s["dropped"].values()) + s["refused_full"]


def test_admission_checks_staleness_duplicates_and_zero_variance():
    versions = FakeVersions(5)
    store = make_store(versions, max_staleness=2, drop_zero_variance=True)
    assert store.offer(make_group("fresh", 5)) == Offer.ACCEPTED
    assert store.offer(make_group("edge", 3)) == "accepted"  # staleness 2 == bound
    assert store.offer(make_group("old", 2)) == Offer.STALE  # staleness 3
    assert store.offer(make_group("fresh", 5)) == Offer.DUPLICATE
    assert store.offer(make_group("flat", 5, rewards=(1.0, 1.0))) == Offer.ZERO_VARIANCE
    assert len(store) == 2
    stats = store.stats()
    assert stats["ingested"] == 2
    assert {k: v for k, v in stats["dropped"].items() if v} == {
        "stale": 1,
        "duplicate": 1,
        "zero_variance": 1,
    }
    assert stats["staleness_hist"] == {0: 1, 2: 1}
    assert_accounted(store)


def test_zero_variance_groups_kept_unless_asked():
    store = make_store()
    assert store.offer(make_group("flat", rewards=(1.0, 1.0))) == Offer.ACCEPTED


def test_a_consumed_group_sent_again_is_a_duplicate():
    store = make_store()
    store.offer(make_group("a"))
    assert ids(store.take(1)) == ["a"]
    assert store.offer(make_group("a")) == Offer.DUPLICATE


def test_stale_groups_are_evicted_as_the_version_advances():
    versions = FakeVersions(0)
    removed: list[tuple[str, str]] = []
    store = ReplayStore(
        ReplayPolicy(max_staleness=1), versions, on_remove=lambda g, r: removed.append((g, r))
    )
    for v in range(3):
        versions.version = v
        store.offer(make_group(f"v{v}", v))
    assert ids(store.pending()) == ["v0", "v1", "v2"]  # v0 admitted at version 0
    versions.version = 3  # v0 (3) and v1 (2) now exceed the bound of 1
    assert ids(store.take(10)) == ["v2"]
    assert store.stats()["dropped"]["stale"] == 2
    assert removed == [("v0", "stale"), ("v1", "stale"), ("v2", "consumed")]
    versions.version = 10
    store.offer(make_group("late", 9))
    assert store.evict_stale() == 0
    versions.version = 11
    assert store.evict_stale() == 1
    assert_accounted(store)


def test_max_staleness_zero_is_synchronous():
    versions = FakeVersions(4)
    store = make_store(versions, max_staleness=0)
    assert store.offer(make_group("on-policy", 4)) == Offer.ACCEPTED
    assert store.offer(make_group("one-behind", 3)) == Offer.STALE


def test_staleness_uses_the_oldest_token_of_the_group():
    versions = FakeVersions(3)
    store = make_store(versions, max_staleness=1)
    group = make_group("spans", 3)
    versions = group.trajectories[0].version_list()
    versions[0] = 1  # an in-flight update mid-response
    group.trajectories[0].token_versions = pack_int32(versions)
    assert store.offer(group) == Offer.STALE


@pytest.mark.parametrize("sampling", ["fifo", "freshest", "random"])
def test_peek_shows_what_take_returns_without_taking(sampling):
    versions = FakeVersions(2)
    store = make_store(versions, sampling=sampling, max_staleness=2)
    for gid, version in [("a", 0), ("b", 2), ("c", 1), ("d", 2), ("e", 0)]:
        store.offer(make_group(gid, version))
    freshest = sampling == "freshest"  # random peeks in fifo order (its take draws its own)
    assert ids(store.peek(3)) == (["b", "d", "c"] if freshest else ["a", "b", "c"])
    assert ids(store.peek(2, floor=1)) == (["b", "d"] if freshest else ["b", "c"])
    assert len(store) == 5 and store.stats()["consumed"] == 0  # nothing taken
    versions.version = 3  # "a" and "e" are stale now: a peek evicts them, as a take would
    peeked = ids(store.peek(5))
    assert peeked == (["b", "d", "c"] if freshest else ["b", "c", "d"])
    assert store.stats()["dropped"]["stale"] == 2
    if sampling != "random":
        assert ids(store.take(5)) == peeked


def test_reuse_up_to_max_reuse_never_twice_in_one_take():
    store = make_store(max_reuse=3)
    store.offer(make_group("a"))
    store.offer(make_group("b"))
    assert ids(store.take(5)) == ["a", "b"]
    assert ids(store.take(5)) == ["a", "b"]
    assert ids(store.take(1)) == ["a"]  # a's third use: it leaves
    assert ids(store.take(5)) == ["b"]  # b's third use
    assert store.take(5) == []
    stats = store.stats()
    assert stats["consumed"] == 6
    assert stats["retired"] == 2 and stats["size"] == 0
    assert_accounted(store)


def test_fifo_returns_oldest_accepted_first_and_honours_floor():
    versions = FakeVersions(2)
    store = make_store(versions, max_staleness=5)
    for gid, v in [("a", 2), ("b", 0), ("c", 1), ("d", 2)]:
        store.offer(make_group(gid, v))
    assert ids(store.take(2, floor=1)) == ["a", "c"]
    assert ids(store.take(5)) == ["b", "d"]


def test_freshest_returns_highest_min_version_first_ties_oldest():
    versions = FakeVersions(3)
    store = make_store(versions, max_staleness=5, sampling="freshest", max_reuse=2)
    for gid, v in [("a", 1), ("b", 3), ("c", 2), ("d", 3), ("e", 0)]:
        store.offer(make_group(gid, v))
    assert ids(store.take(3)) == ["b", "d", "c"]
    assert ids(store.take(10, floor=2)) == ["b", "d", "c"]  # second use; then retired
    assert ids(store.take(10)) == ["a", "e"]
    assert ids(store.take(10, floor=1)) == ["a"]
    assert ids(store.pending()) == ["e"]


def test_random_is_seeded_distinct_and_honours_floor():
    def run(seed: int) -> list[list[str]]:
        versions = FakeVersions(1)
        store = ReplayStore(
            ReplayPolicy(sampling="random", max_reuse=3, capacity=100), versions, seed=seed
        )
        for i in range(20):
            store.offer(make_group(f"g{i}", i % 2))
        return [ids(store.take(6, floor=1)) for _ in range(3)]

    first = run(7)
    assert first == run(7)
    assert first != run(8)
    for batch in first:
        assert len(batch) == len(set(batch)) == 6
        assert all(int(g[1:]) % 2 == 1 for g in batch)  # only min_version 1 passes the floor


def test_overflow_drop_oldest_evicts_and_counts():
    store = make_store(capacity=2)
    for gid in "abc":
        assert store.offer(make_group(gid)) == Offer.ACCEPTED
    assert ids(store.pending()) == ["b", "c"]
    assert store.stats()["dropped"]["overflow"] == 1
    assert_accounted(store)


def test_overflow_block_refuses_until_space_frees():
    store = make_store(capacity=2, overflow="block")
    store.offer(make_group("a"))
    store.offer(make_group("b"))
    assert store.offer(make_group("c")) == Offer.FULL
    assert ids(store.pending()) == ["a", "b"]
    stats = store.stats()
    assert stats["refused_full"] == 1 and sum(stats["dropped"].values()) == 0
    store.take(1)
    assert store.offer(make_group("c")) == Offer.ACCEPTED  # the retry is not a duplicate
    assert ids(store.pending()) == ["b", "c"]
    assert_accounted(store)


def test_capacity_tokens_bounds_the_sum_of_tokens():
    store = make_store(capacity=100, capacity_tokens=20)  # each group: 2 x 4 = 8 tokens
    for gid in "abc":
        store.offer(make_group(gid))
    assert ids(store.pending()) == ["b", "c"] and store.stats()["tokens"] == 16
    assert store.offer(make_group("huge", tokens=12)) == Offer.TOO_LARGE  # 24 > 20 alone
    blocking = make_store(capacity=100, capacity_tokens=20, overflow="block")
    blocking.offer(make_group("a"))
    blocking.offer(make_group("b"))
    assert blocking.offer(make_group("c")) == Offer.FULL
    assert blocking.offer(make_group("small", rewards=(0.0,), tokens=4)) == Offer.ACCEPTED


def test_reconfigure_applies_live_and_shrinking_capacity_evicts_oldest():
    versions = FakeVersions(0)
    store = make_store(versions, capacity=5)
    for gid in "abcde":
        store.offer(make_group(gid))
    changes = store.reconfigure(capacity=3, sampling="freshest", max_staleness=2)
    assert changes == {"capacity": (5, 3), "sampling": ("fifo", "freshest")}
    assert ids(store.pending()) == ["c", "d", "e"]
    assert store.stats()["dropped"]["capacity"] == 2
    assert store.stats()["capacity"] == 3
    store.reconfigure(capacity_tokens=8)
    assert ids(store.pending()) == ["e"]
    store.reconfigure(capacity_tokens=None)
    versions.version = 1
    store.reconfigure(max_staleness=0)  # takes effect at the next eviction decision
    assert store.take(1) == [] and store.stats()["dropped"]["stale"] == 1
    assert_accounted(store)


def test_lowering_max_reuse_retires_groups_already_used_enough():
    store = make_store(max_reuse=3)
    store.offer(make_group("a"))
    store.offer(make_group("b"))
    store.take(1)
    store.take(1)  # a used twice
    store.reconfigure(max_reuse=2)
    assert ids(store.pending()) == ["b"]
    assert store.stats()["retired"] == 1


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"capacity": 0}, "capacity"),
        ({"capacity": 4, "sampling": "lifo"}, "sampling"),
        ({"max_staleness": -1}, "max_staleness"),
        ({"max_reuse": True}, "max_reuse"),
        ({"overflow": "spill"}, "overflow"),
        ({"capacity_tokens": 0}, "capacity_tokens"),
        ({"capacity": 1, "colour": "red"}, "colour"),
    ],
)
def test_invalid_reconfigure_changes_nothing(changes, key):
    store = make_store(capacity=3)
    for gid in "abc":
        store.offer(make_group(gid))
    before = store.policy
    with pytest.raises(ValueError, match=repr(key)) as info:
        store.reconfigure(**changes)
    assert "\n" not in str(info.value)
    assert store.policy == before
    assert ids(store.pending()) == ["a", "b", "c"]


def test_invalid_policy_is_rejected_at_construction():
    with pytest.raises(ValueError, match="'sampling'"):
        ReplayPolicy(sampling="lifo")


def test_stats_reports_size_bytes_and_every_drop_reason():
    versions = FakeVersions(3)
    store = make_store(versions, capacity=2, max_staleness=1, drop_zero_variance=True)
    store.offer(make_group("a", 3))
    store.offer(make_group("b", 2))
    store.offer(make_group("c", 3))  # overflow evicts a
    store.offer(make_group("c", 3))  # duplicate
    store.offer(make_group("d", 0))  # stale
    store.offer(make_group("e", 3, rewards=(0.5, 0.5)))  # zero variance
    store.reconfigure(capacity=1)  # evicts b
    stats = store.stats()
    assert stats["dropped"] == {
        "stale": 1,
        "duplicate": 1,
        "zero_variance": 1,
        "too_large": 0,
        "overflow": 1,
        "capacity": 1,
        "dead_timeline": 0,
        "invalid": 0,
    }
    assert stats["size"] == 1 and stats["ingested"] == 3 and stats["offered"] == 6
    # one group, two trajectories of 2 prompt + 2 response tokens, 4 bytes per element of
    # the prompt ids, response ids, logprobs and versions: 2 * (4*2 + 3 * 4*2)
    assert stats["bytes"] == 64
    assert stats["staleness_hist"] == {0: 1}
    assert_accounted(store)


def test_heaps_stay_bounded_under_churn():
    versions = FakeVersions(0)
    store = make_store(versions, capacity=8, sampling="freshest", max_staleness=3)
    for i in range(2000):
        versions.version = i // 10
        store.offer(make_group(f"g{i}", versions.version))
        if i % 3 == 0:
            store.take(2)
    assert len(store._by_version) < 100
    assert len(store._by_freshness) < 100
    assert_accounted(store)


def test_policy_tokens_are_counted_by_what_became_of_their_group():
    """Useful generation's input: each group's policy tokens (here 2 responses of 2 tokens)
    under "trained" at its first take, else its drop reason; evicting a trained group later
    does not count it as lost."""
    versions = FakeVersions(5)
    store = make_store(versions, max_staleness=1, drop_zero_variance=True, max_reuse=2)
    assert make_group("a", 5).policy_tokens == 4
    store.offer(make_group("a", 5))
    store.offer(make_group("b", 5))
    store.offer(make_group("flat", 5, rewards=(1.0, 1.0)))
    store.offer(make_group("old", 3))
    assert store.stats()["stored_policy_tokens"] == 8
    assert [g.group_id for g in store.take(1)] == ["a"]
    versions.version = 7  # "a" (taken once, still stored for its reuse) and "b" go stale
    assert store.evict_stale() == 2
    stats = store.stats()
    assert stats["tokens_by_fate"] == {"trained": 4, "zero_variance": 4, "stale": 8}
    assert stats["stored_policy_tokens"] == 0
