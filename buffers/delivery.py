"""Acknowledged delivery from generators to a buffer shard: no group lost in transit, none twice.

A PUSH socket gives no receipt: groups in a shard's socket buffers when its process dies are
gone, and the generator cannot tell. So each group carries its delivery identity as typed
fields, ``TrajectoryGroup.sender`` and ``.seq``, given when the generator assigns it to a shard
(``Outbox.address``): ``sender`` is unique to the process and the shard (``shard_sender``: a
random base plus the shard id), ``seq`` numbers the groups it gives that shard (0, 1, ...): the
generator gives them by grant order (``ShardPushers.address``: grant k of its incarnation is
shard k % S's seq k // S), and may push them in another order (served scoring settles groups
as their scores come). So what a shard logged of a sender is nearly a prefix; ``Delivered``
keeps, per sender, the floor (every seq up to it logged) and the few seqs logged above it,
and the controller reads both (``ShardStats.delivered``, ``.delivered_above``) to tell which
of a dead generator's grants arrived.

The group's id is ``<sender>-<seq>`` of that identity (``group_id``), because the durable log
keeps only ids (a refused group's row has no payload) and reads the identity back from them
(``parse_group_id``) when a shard restarts. So the shard refuses a frame whose fields and id
disagree (``identity_error``), and a frame from before the fields (sender "") is read by its
id alone (``identity``), as the log reads every row.

The receipt travels back through the controller: shard stats carry the floors
(``ShardStats.delivered``), the admission reply hands each generator its own (its ``Receipts``
part), and the generator forgets the groups up to them (``Outbox``). When the controller
restarts a shard on its log, the receipts' ``shard_epochs`` rises and the
generator sends every group that shard has not acknowledged again; the restarted shard,
whose ``Delivered`` comes back from its log, drops those it has logged already (counted as
``resent_duplicates``). So a shard's log holds every group sent to it exactly once.

Example: a shard logged seqs 0, 1, 2 and 4 of a sender: floor 2, above {4}; seq 3
(resent) is new and lifts the floor to 4; seq 1 again is a duplicate.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections import OrderedDict
from typing import Any

from streamrl.protocol import TrajectoryGroup

log = logging.getLogger(__name__)

_ID = re.compile(r"^([0-9a-f]{12}\.\d{1,5})-(\d{1,18})$")
# Groups an outbox keeps without a receipt before it forgets the oldest (logged): receipts
# normally come within a second or two, so this is only reached with the controller gone.
MAX_UNACKED = 1 << 16


def new_sender() -> str:
    """A fresh base name for one generator process (12 hex digits, random)."""
    return uuid.uuid4().hex[:12]


def shard_sender(base: str, shard_id: int) -> str:
    """The sender name of process ``base``'s groups to shard ``shard_id``."""
    return f"{base}.{shard_id}"


def group_id(sender: str, seq: int) -> str:
    return f"{sender}-{seq}"


def parse_group_id(gid: str) -> tuple[str, int] | None:
    """``(sender, seq)`` of an id made by ``group_id``; None for any other id (such groups
    are stored as before, without delivery tracking)."""
    match = _ID.match(gid)
    return (match.group(1), int(match.group(2))) if match else None


def identity(gid: str, sender: str = "", seq: int = -1) -> tuple[str, int] | None:
    """A group's ``(sender, seq)``: its typed fields, or, for a frame from before them or a
    log row (``sender`` ""), what its id says (``parse_group_id``). None: not tracked."""
    return (sender, seq) if sender else parse_group_id(gid)


def identity_error(gid: str, sender: str, seq: int) -> str | None:
    """Why a group's typed identity cannot be trusted, or None: its id must name the same
    identity, since the durable log keeps only the id and reads the identity back from it."""
    if not sender or parse_group_id(gid) == (sender, seq):
        return None
    return f"sender {sender!r} and seq {seq} do not match id {gid!r}"


class Delivered:
    """Per sender: every seq ``<= floor`` is logged, and so is each seq in ``above``."""

    def __init__(self) -> None:
        self.floor: dict[str, int] = {}
        self.above: dict[str, set[int]] = {}

    def seen(self, gid: str, sender: str = "", seq: int = -1) -> bool:
        """Whether the group of this ``identity`` has arrived (an untracked one: never)."""
        key = identity(gid, sender, seq)
        if key is None:
            return False
        sender, seq = key
        return seq <= self.floor.get(sender, -1) or seq in self.above.get(sender, ())

    def add(self, gid: str, sender: str = "", seq: int = -1) -> bool:
        """Record the arrival of the group of this ``identity`` (the typed fields; without
        them, the id's); False if it had arrived already (an untracked group: always True)."""
        key = identity(gid, sender, seq)
        if key is None:
            return True
        sender, seq = key
        floor = self.floor.get(sender, -1)
        if seq <= floor or seq in self.above.get(sender, ()):
            return False
        above = self.above.setdefault(sender, set())
        above.add(seq)
        while floor + 1 in above:
            floor += 1
            above.discard(floor)
        self.floor[sender] = floor  # every tracked sender has a floor (-1: none yet)
        if not above:
            del self.above[sender]
        return True

    def floors(self) -> dict[str, int]:
        return dict(self.floor)

    def to_json(self) -> dict[str, Any]:
        return {s: [f, sorted(self.above.get(s, ()))] for s, f in self.floor.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Delivered:
        out = cls()
        for sender, (floor, above) in data.items():
            out.floor[str(sender)] = int(floor)
            if above:
                out.above[str(sender)] = {int(s) for s in above}
        return out


class Outbox:
    """One generator process's groups to one shard, kept until the shard acknowledges them.

    Example::

        box = Outbox(shard_sender(base, 0))
        seq = box.address(group)         # group.sender, .seq and .group_id set
        box.keep(seq, frame)             # the encoded group, just sent
        receipts = reply.parts().receipts  # an AdmissionReply's
        box.acknowledge(receipts.delivered.get(0, -1))
        for frame in box.resend_for(receipts.shard_epochs.get(0, 0)): sock.send(frame)
    """

    def __init__(self, sender: str) -> None:
        self.sender = sender
        self.next_seq = 0
        self.unacked: OrderedDict[int, bytes] = OrderedDict()
        self.epoch = 0  # the shard restarts this outbox has resent for
        self.resent = 0
        self.forgotten = 0

    def address(self, group: TrajectoryGroup, seq: int | None = None) -> int:
        """Give ``group`` its delivery identity, once, as it is assigned to this outbox's shard:
        this sender, ``seq`` (its grant's; by default the next), and the id made of them.
        Returns the seq."""
        if seq is None:
            seq = self.next_seq
        self.next_seq = max(self.next_seq, seq + 1)
        group.sender, group.seq, group.group_id = self.sender, seq, group_id(self.sender, seq)
        return seq

    def keep(self, seq: int, frame: bytes) -> None:
        """Keep the frame of group ``seq`` (just sent) until the shard acknowledges it."""
        self.unacked[seq] = frame
        if len(self.unacked) > MAX_UNACKED:
            self.unacked.popitem(last=False)
            if not self.forgotten:
                log.warning(
                    "%s: no receipts for %d groups; forgetting the oldest", self.sender, MAX_UNACKED
                )
            self.forgotten += 1

    def acknowledge(self, floor: int) -> None:
        """The shard has every seq up to ``floor``: forget them (kept in push order, which
        need not be seq order)."""
        for seq in [seq for seq in self.unacked if seq <= floor]:
            del self.unacked[seq]

    def resend_for(self, epoch: int) -> list[bytes]:
        """The frames to send again if the shard restarted since the last call (``epoch``
        rose): every one not acknowledged, in push order; the shard drops those it has."""
        if epoch <= self.epoch:
            return []
        self.epoch = epoch
        self.resent += len(self.unacked)
        return list(self.unacked.values())
