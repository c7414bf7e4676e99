"""A leaving generator waits for the shards' receipts, resending to a shard that restarted
(``ShardPushers``, the generator's sockets part, with a fake pusher and admission)."""

from __future__ import annotations

from streamrl.protocol import (
    AdmissionReply,
    Directives,
    LearnerClockInfo,
    Receipts,
    TrajectoryGroup,
)
from streamrl.workers.generation.generator_sockets import ShardPushers


class Admission:
    """Admission replies in order (a test double: what the controller would relay)."""

    def __init__(self, replies: list[AdmissionReply]) -> None:
        self.replies, self.asked = replies, []

    def request(self, n_groups: int, timeout_s: float = 30.0) -> AdmissionReply:
        self.asked.append(n_groups)
        return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]


class Pusher:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, frame: bytes) -> None:
        self.sent.append(frame)


def pushed_three() -> ShardPushers:
    """One shard, seqs 0, 1, 2 sent (frames ``frame0`` ...) and none acknowledged."""
    pushers = ShardPushers([Pusher()], "abcdefabcdef", generator_id=1)
    box = pushers.outboxes[0]
    for i in range(3):
        seq = box.address(TrajectoryGroup("", f"p{i}", [], 0.0, 0.0))
        box.keep(seq, f"frame{i}".encode())
    return pushers


def reply(floor: int, epoch: int = 0) -> AdmissionReply:
    return AdmissionReply(
        directives=Directives(retire=True),
        clock=LearnerClockInfo(learner_version=5),
        receipts=Receipts(delivered={0: floor}, shard_epochs={0: epoch}),
    )


def test_pushes_round_robin_and_keeps_each_frame_until_its_receipt():
    pushers = ShardPushers([Pusher(), Pusher()], "abcdefabcdef", generator_id=0)
    groups = [TrajectoryGroup("", f"p{i}", [], 0.0, 0.0) for i in range(3)]
    pushers.push(groups)
    assert [g.group_id for g in groups] == [
        "abcdefabcdef.0-0",
        "abcdefabcdef.1-0",
        "abcdefabcdef.0-1",
    ]
    assert [len(p.sent) for p in pushers.pushers] == [2, 1]
    assert pushers.groups_pushed == 3
    pushers.take_receipts(Receipts(delivered={0: 0}, shard_epochs={1: 1}))
    assert list(pushers.outboxes[0].unacked) == [1]  # shard 0 acknowledged seq 0
    assert len(pushers.pushers[1].sent) == 2  # shard 1 restarted: its group sent again


def test_waits_for_receipts_and_resends_to_a_restarted_shard():
    # The shard had seq 0, restarted (epoch 1) having lost 1 and 2, then logged the resends.
    pushers, admission = pushed_three(), Admission([reply(0), reply(0, epoch=1), reply(2, 1)])
    assert pushers.await_receipts(admission, timeout_s=5) == 0
    assert pushers.pushers[0].sent == [b"frame1", b"frame2"]
    assert admission.asked == [0, 0, 0]  # asks for nothing: receipts only


def test_gives_up_after_its_timeout_and_says_how_many_are_unacknowledged(caplog):
    assert pushed_three().await_receipts(Admission([reply(0)]), timeout_s=0.3) == 2
    assert "leaving with 2 groups no shard acknowledged" in caplog.text
