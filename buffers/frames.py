"""Ingest frames -> what a shard stores: one decode and check per group, the frame kept.

A shard decodes every ``TrajectoryGroup`` frame fully: its token arrays are msgpack ``bin``
(raw bytes, docs/design.md §5), so decoding copies them instead of parsing numbers, and then it
checks the arrays (``TrajectoryGroup.check``) and the versions. It keeps only a summary (ids,
versions, sizes, rewards) plus the frame itself: memory stays at wire size, the durable log
stores the frame as the group's payload, and replies forward it unchanged (``RawBatch``),
with no re-encoding.

Malformed input (garbage, truncated msgpack, invalid UTF-8, nesting too deep, wrong types or
kinds, inconsistent array lengths, negative versions, wrong frame counts) is counted by kind,
logged once per kind and dropped. Nothing is unpickled.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamrl.protocol import TrajectoryGroup
from streamrl.transport import Codec


@dataclass(slots=True, eq=False)
class StoredGroup:
    """What a shard holds for one group: what its store and durable log read (the
    ``replay.Group`` and ``durable_log.LoggedGroup`` protocols), computed once, and the
    frame the group arrived in."""

    group_id: str
    prompt_id: str
    created_at: float
    finished_at: float
    min_version: int
    max_version: int
    num_tokens: int
    nbytes: int
    rewards: list[float]
    frame: bytes
    weights_epoch: int = 0
    prompt_index: int = -1

    @classmethod
    def of(cls, group: TrajectoryGroup, frame: bytes) -> StoredGroup:
        """``frame`` must be ``group``'s msgpack encoding."""
        lo, hi = group.version_range()
        return cls(
            group.group_id,
            group.prompt_id,
            group.created_at,
            group.finished_at,
            lo,
            hi,
            group.num_tokens,
            group.nbytes,
            group.rewards,
            frame,
            group.weights_epoch,
            group.prompt_index,
        )


class GroupDecoder:
    """Frame -> ``StoredGroup``, or ``None`` (counted by kind, logged once) if malformed."""

    def __init__(self, name: str) -> None:
        self.codec: Codec[TrajectoryGroup] = Codec(TrajectoryGroup, name)

    @property
    def malformed(self):
        return self.codec.malformed

    def decode(self, frame: bytes) -> StoredGroup | None:
        group = self.codec.decode(frame)
        if group is None:
            return None
        reason = group.check()
        if reason is not None:
            return self.reject("inconsistent_lengths", f"group {group.group_id!r}: {reason}")
        stored = StoredGroup.of(group, frame)
        if stored.min_version < 0:
            detail = f"group {group.group_id!r}: negative version {stored.min_version}"
            return self.reject("ValidationError", detail)
        return stored

    def reject(self, kind: str, detail: str) -> None:
        self.codec.count_malformed(kind, detail)
