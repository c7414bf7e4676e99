from __future__ import annotations

from streamrl.config import BufferConfig
from streamrl.controller.staleness import AdmissionPolicy


class FakeVersions:
    def __init__(self) -> None:
        self.version = 0

    def current_version(self) -> int:
        return self.version


def test_admits_staleness_plus_one_batches_ahead() -> None:
    versions = FakeVersions()
    policy = AdmissionPolicy(
        groups_per_step=4, bound=BufferConfig(max_staleness=1), versions=versions
    )
    grants = [policy.request(3) for _ in range(4)]
    assert [g.granted for g in grants] == [3, 3, 2, 0]
    # Group 5 (0-based) belongs to batch 1 and may start on version 0 (staleness 1 allowed).
    assert grants[1].min_version == 0
    versions.version = 1
    more = policy.request(4)
    assert more.granted == 4
    # Groups 8..11 belong to batch 2: they need weights >= 2 - 1 = 1.
    assert more.min_version == 1


def test_sync_mode_one_batch_per_version_on_fresh_weights() -> None:
    versions = FakeVersions()
    policy = AdmissionPolicy(
        groups_per_step=2, bound=BufferConfig(max_staleness=0), versions=versions
    )
    assert policy.request(5).granted == 2
    assert policy.request(1).granted == 0
    versions.version = 1
    grant = policy.request(2)
    assert (grant.granted, grant.min_version) == (2, 1)


def test_dropped_groups_return_their_budget() -> None:
    versions = FakeVersions()
    policy = AdmissionPolicy(
        groups_per_step=2, bound=BufferConfig(max_staleness=0), versions=versions
    )
    assert policy.request(2).granted == 2
    policy.set_dropped(1)
    assert policy.request(2).granted == 1
    policy.set_dropped(0)  # counts are monotonic; a stale report never takes budget back
    assert policy.dropped == 1


def test_no_group_is_budgeted_past_the_last_step() -> None:
    """Two steps in all (η = 1): at v=1 the bound would open a third step's groups; the run
    has none, so it stays at two steps' worth. A group dropped then is still replaced."""
    versions = FakeVersions()
    policy = AdmissionPolicy(
        groups_per_step=2, bound=BufferConfig(max_staleness=1), versions=versions, last_step=2
    )
    assert policy.request(8).granted == 4  # steps 1 and 2
    versions.version = 1
    assert policy.request(2).granted == 0  # step 3 never comes
    policy.set_dropped(1)  # one of step 2's groups came back alike
    assert policy.request(2).granted == 1
    unbounded = AdmissionPolicy(2, BufferConfig(max_staleness=1), versions)
    assert unbounded.request(8).granted == 6
