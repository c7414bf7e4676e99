"""A leaving generator waits for the shards' receipts, resending to a shard that restarted."""

from __future__ import annotations

from types import SimpleNamespace

from support import make_group

from streamrl.buffers.delivery import Outbox
from streamrl.protocol import AdmissionReply, Directives, LearnerClockInfo, Receipts
from streamrl.workers.generator import Generator


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


def leaving_generator(replies: list[AdmissionReply]) -> SimpleNamespace:
    box = Outbox("abcdefabcdef.0")
    for i in range(3):  # pushed seqs 0, 1, 2
        seq = box.address(make_group(f"g{i}"))
        box.keep(seq, f"frame{i}".encode())
    gen = SimpleNamespace(
        outboxes=[box], pushers=[Pusher()], admission=Admission(replies), generator_id=1
    )
    gen.take_receipts = lambda receipts: Generator.take_receipts(gen, receipts)
    return gen


def reply(floor: int, epoch: int = 0) -> AdmissionReply:
    return AdmissionReply(
        directives=Directives(retire=True),
        clock=LearnerClockInfo(learner_version=5),
        receipts=Receipts(delivered={0: floor}, shard_epochs={0: epoch}),
    )


def test_waits_for_receipts_and_resends_to_a_restarted_shard():
    # The shard had seq 0, restarted (epoch 1) having lost 1 and 2, then logged the resends.
    gen = leaving_generator([reply(0), reply(0, epoch=1), reply(2, epoch=1)])
    assert Generator.await_receipts(gen, timeout_s=5) == 0
    assert gen.pushers[0].sent == [b"frame1", b"frame2"]
    assert gen.admission.asked == [0, 0, 0]  # asks for nothing: receipts only


def test_gives_up_after_its_timeout_and_says_how_many_are_unacknowledged(caplog):
    gen = leaving_generator([reply(0)])
    assert Generator.await_receipts(gen, timeout_s=0.3) == 2
    assert "leaving with 2 groups no shard acknowledged" in caplog.text
