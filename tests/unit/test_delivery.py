"""Acknowledged delivery (``buffers.delivery``): receipts, resends, and their record on the log."""

from __future__ import annotations

from support import make_group

from streamrl.buffers.delivery import (
    Delivered,
    Outbox,
    group_id,
    identity,
    identity_error,
    new_sender,
    parse_group_id,
    shard_sender,
)
from streamrl.buffers.durable_log import DurableLog


def test_floor_rises_over_gaps_once_they_fill():
    sender = shard_sender(new_sender(), 3)
    seen = Delivered()
    for seq in (0, 1, 2, 4):
        seen.add(group_id(sender, seq))
    assert seen.floors() == {sender: 2} and seen.above == {sender: {4}}
    assert not seen.seen(group_id(sender, 3)) and seen.seen(group_id(sender, 1))
    assert seen.add(group_id(sender, 3))  # the resent one fills the gap
    assert not seen.add(group_id(sender, 3)) and not seen.add(group_id(sender, 4))
    assert seen.floors() == {sender: 4} and seen.above == {}
    assert Delivered.from_json(seen.to_json()).floors() == {sender: 4}


def test_ids_not_made_by_a_sender_are_not_tracked():
    seen = Delivered()
    for gid in ("g1", "deadbeef", "0123456789ab-1", "0123456789ab.0-x", ""):
        assert parse_group_id(gid) is None
        seen.add(gid)
        assert not seen.seen(gid)
    assert seen.floors() == {}


def test_typed_identity_and_an_old_frames_id_name_the_same_group():
    sender = shard_sender(new_sender(), 1)
    seen = Delivered()
    assert seen.add("", sender, 0)  # typed fields: the id is not read
    assert not seen.add(group_id(sender, 0))  # the same group as an old frame (or a log row)
    assert seen.add(group_id(sender, 1)) and not seen.add("ignored", sender, 1)
    assert seen.floors() == {sender: 1} and seen.seen("", sender, 1)
    assert identity("g1") is None and identity(group_id(sender, 7)) == (sender, 7)


def test_typed_identity_must_agree_with_the_id_the_log_keeps():
    sender = shard_sender(new_sender(), 0)
    assert identity_error(group_id(sender, 3), sender, 3) is None
    assert identity_error("anything", "", -1) is None  # an old frame: its id is all there is
    assert "do not match" in identity_error(group_id(sender, 3), sender, 4)
    assert "do not match" in identity_error("g1", sender, 3)
    assert "do not match" in identity_error("x-3", "x", 3)  # the log could not parse it back


def test_outbox_gives_each_group_its_identity_once():
    box = Outbox(shard_sender(new_sender(), 2))
    groups = [make_group(f"g{i}") for i in range(3)]
    assert [box.address(g) for g in groups] == [0, 1, 2]
    last = groups[-1]
    assert (last.sender, last.seq) == (box.sender, 2)
    assert last.group_id == group_id(box.sender, 2)
    assert parse_group_id(last.group_id) == (last.sender, last.seq)


def test_outbox_forgets_acknowledged_groups_and_resends_the_rest_once_per_restart():
    box = Outbox(shard_sender(new_sender(), 0))
    for i in range(5):
        seq = box.address(make_group(f"g{i}"))
        box.keep(seq, f"frame {seq}".encode())
    box.acknowledge(1)
    assert list(box.unacked) == [2, 3, 4]
    assert box.resend_for(0) == []  # no restart yet
    assert box.resend_for(1) == [b"frame 2", b"frame 3", b"frame 4"]
    assert box.resend_for(1) == []
    box.acknowledge(4)
    assert box.resend_for(2) == []


def test_the_log_remembers_what_arrived_across_reopen_and_compaction(tmp_path):
    sender = shard_sender(new_sender(), 0)
    groups = [make_group(f"g{i}") for i in range(4)]
    for seq, group in enumerate(groups):
        group.group_id = group_id(sender, seq)
    with DurableLog(tmp_path, 0) as log:
        log.append_many(groups[:2])
        log.refuse([groups[3].group_id], ["stale"])
        log.mark_consumed([groups[0].group_id])
        log.compact()  # the consumed group's row is gone; its arrival is not forgotten
    with DurableLog(tmp_path, 0) as log:
        seen = log.tallies.delivered
        assert seen.floors() == {sender: 1} and seen.above == {sender: {3}}
        assert [seen.seen(g.group_id) for g in groups] == [True, True, False, True]
