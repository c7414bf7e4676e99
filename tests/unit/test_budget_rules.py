"""The run's budget rules as pure ``RunState`` methods, and the role registry: no controller,
no Ray, no sockets."""

from __future__ import annotations

from streamrl.buffers.delivery import shard_sender
from streamrl.config import BufferConfig
from streamrl.controller.roles import RoleId, Roles, RoleSlot
from streamrl.controller.staleness import AdmissionPolicy
from streamrl.controller.state import GeneratorHealth, PromptLedger, RunState
from streamrl.protocol import GeneratorReport, ShardStats, TakeReceipt


def state_with_policy(gps: int = 2, eta: int = 1) -> RunState:
    state = RunState()
    state.policy = AdmissionPolicy(gps, BufferConfig(max_staleness=eta), state)
    return state


def stats(shard_id: int, **fields) -> ShardStats:
    return ShardStats(shard_id, 0, 64, 0, 0, {}, 0, **fields)


def test_a_learner_restart_gives_back_exactly_what_the_receipts_name():
    """Epoch 0 reached version 5; the group resumes from 3. Steps 4 and 5 took 2 groups each
    and a take for step 6 was parked when the rank died (no BatchTaken ever came)."""
    state = state_with_policy()
    state.version = 5
    state.prompts.taken(4, [10, 11])  # the only report that came
    receipts = [TakeReceipt(0, 4, [10, 11]), TakeReceipt(0, 5, [12, 13]), TakeReceipt(0, 6, [14])]
    again = state.learners_restarted(3, [3], receipts, groups_per_step=2)
    assert again == [10, 11, 12, 13, 14]
    assert state.rolled_back == 5 == len(again)
    assert state.policy.returned == 5
    assert (state.version, state.weights_epoch, state.forks) == (3, 1, [3])
    assert state.prompts.grant(0, 6) == [10, 11, 12, 13, 14, 0]


def test_reused_groups_give_back_one_group_per_max_reuse_uses_lost():
    state = state_with_policy()
    receipts = [TakeReceipt(0, 4, [1, 2]), TakeReceipt(0, 5, [1, 3]), TakeReceipt(0, 6, [2])]
    state.learners_restarted(3, [3], receipts, groups_per_step=2, max_reuse=2)
    assert state.policy.returned == 3  # 5 uses lost: 3 groups of 2 uses replace them


def test_a_dead_generators_groups_are_reconciled_from_the_shards_receipts():
    state = state_with_policy(gps=4, eta=4)
    state.health[0] = GeneratorHealth(sender="0123456789ab")
    state.prompts.grant(0, 6)  # prompts 0..5
    state.prompts.delivered(0, 2)  # it reported 2 pushed, then died
    # Shards 0 and 1 acknowledge seqs 0..1 and 0..1 of its sender: 4 groups arrived.
    state.shards = {s: stats(s, delivered={shard_sender("0123456789ab", s): 1}) for s in (0, 1)}
    state.generators[0] = GeneratorReport(0, 3, 100, 2, 0, 0, 1.0)
    assert state.arrived_from(0, shards=2) == {0: 1, 1: 1}
    assert state.release_generator(0, state.arrived_from(0, shards=2)) == 2  # only 4 and 5

    assert state.prompts.grant(1, 2) == [4, 5]
    assert state.ended[-1].groups_pushed == 4  # the run's totals count what arrived


def test_a_report_in_flight_when_its_generator_was_released_is_counted_once():
    """A retiring generator's last report can reach the controller after its release: it
    updates that incarnation's totals, and does not come back as a live generator (which
    counted its groups twice: ``groups_lost_in_transit`` 8 with every group delivered)."""
    state = state_with_policy()
    state.health[2] = GeneratorHealth()
    state.prompts.grant(2, 8)
    state.generator_report(GeneratorReport(2, 5, 60, 6, 0, 0, 1.0))
    assert state.release_generator(2, {0: 7}) == 0
    assert state.generator_report(GeneratorReport(2, 8, 80, 8, 0, 0, 2.0))
    assert 2 not in state.generators
    assert sum(r.groups_pushed for r in state.all_generator_reports()) == 8
    assert state.ended[-1].applied_version == 8  # the newer report's other totals
    # A later incarnation under the same id is live again.
    state.health[2].incarnation, state.health[2].released = 1, False
    state.generator_report(GeneratorReport(2, 9, 10, 1, 0, 0, 3.0, incarnation=1))
    assert 2 in state.generators
    assert sum(r.groups_pushed for r in state.all_generator_reports()) == 9


def test_a_group_reported_pushed_that_never_arrived_is_generated_again():
    ledger = PromptLedger()
    ledger.grant(0, 3)
    ledger.delivered(0, 3)  # reported all three; one died in its socket with the process
    assert ledger.release(0, {0: 1}) == 1
    assert ledger.grant(1, 1) == [2]


def test_with_several_shards_exactly_the_grants_no_shard_has_come_back():
    """Pushes go round-robin from shard 0: grants 0, 2, 4 to shard 0 (seqs 0-2), 1, 3, 5 to
    shard 1. Shard 0 acknowledges all three, shard 1 only its first: what arrived is grants
    0, 1, 2, 4, not a prefix of the grant order, so a sum of floors (4 arrived) would hand
    out prompt 4 again and lose 3."""
    ledger = PromptLedger()
    ledger.grant(0, 6)  # prompts 0..5
    ledger.delivered(0, 6)
    assert ledger.release(0, {0: 2, 1: 0}) == 2
    assert ledger.grant(1, 3) == [3, 5, 6]


def test_a_restarted_generator_s_grants_count_from_its_own_first_push():
    ledger = PromptLedger()
    ledger.grant(0, 2)
    ledger.release(0, {0: 1, 1: -1})  # 0 arrived on shard 0; 1 never reached shard 1
    assert ledger.grant(0, 3) == [1, 2, 3]  # the new incarnation's pushes 0, 1, 2
    assert ledger.release(0, {0: 0, 1: -1}) == 2  # push 0 (prompt 1) arrived
    assert list(ledger.retry) == [2, 3]


def test_without_receipts_the_reports_decide_as_before():
    ledger = PromptLedger()
    ledger.grant(0, 3)
    ledger.delivered(0, 1)
    assert ledger.release(0) == 2 and ledger.grant(1, 2) == [1, 2]


def test_restore_admission_counts_the_durable_logs():
    state = state_with_policy(gps=2)
    state.shards = {0: stats(0, received_total=12, removed_total={"consumed": 8, "stale": 1})}
    state.restore_admission(version=3, groups_per_step=2)
    # 12 started, 1 dropped; steps 1-3 used 6 of the 8 consumed: 2 went with lost steps.
    assert (state.policy.started, state.policy.dropped, state.policy.returned) == (12, 1, 2)
    assert state.rolled_back == 2


def test_roles_have_typed_ids_one_slot_each_and_find_their_loops():
    roles = Roles()
    roles.put(RoleId.shard(0), RoleSlot("shard-actor", run_ref="serve-0", pid=11))
    roles.put(RoleId.learner(1), RoleSlot("rank-1", run_ref="run-1", pid=12))
    roles.put(RoleId.learner(0), RoleSlot("rank-0", run_ref="run-0", pid=13))
    roles.put(RoleId.generator(0), RoleSlot("gen-0", run_ref="gen-run", pid=-1))
    assert str(RoleId.shard(0)) == "buffer shard 0" and roles.role_of("run-1") == RoleId.learner(1)
    assert roles.actors("learner rank") == ["rank-0", "rank-1"]  # by rank
    assert roles.run_refs("buffer shard", "learner rank") == ["serve-0", "run-0", "run-1"]
    assert roles.pids_by_role() == {
        "buffer shard 0": 11,
        "learner rank 0": 13,
        "learner rank 1": 12,
    }
    roles.put(RoleId.learner(1), RoleSlot("rank-1b", run_ref="run-1b"))  # a restart
    assert roles.role_of("run-1") is None and roles.role_of("run-1b") == RoleId.learner(1)
