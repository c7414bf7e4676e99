"""What has arrived from one learner rank and not been applied yet (the subscriber's
bookkeeping, docs/design.md §4): a rank's staged chunks by version, its anchor, the holes in
its in-order chunk sequence, the diff written ahead into the image, and the chains of steps
(``RankStream.paths``) that bring its rows from the version held to each version they can
reach. Pure data: no sockets and no image; ``WeightSubscriber`` owns those."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from streamrl.protocol import ImageChecksum, WeightDiff, WeightMessage
from streamrl.workers.weight_codec import EncodedPart, Undo


@dataclass
class ChunkMessage:
    """One received chunk: its header and its parts with their payload buffers."""

    header: WeightMessage
    parts: list[EncodedPart]


@dataclass
class VersionStep:
    """One version step of a rank's rows: its parts, and the whole-shard checksum to verify
    once they are applied (``None``: not a verified version, or an anchor)."""

    version: int
    parts: list[EncodedPart]
    check: ImageChecksum | None = None


Steps = list[VersionStep]  # applied in order


@dataclass
class AheadWrite:
    """A rank's diff from the version the image holds, written into the image chunk by chunk
    as its chunks arrive (``write_ahead``): how far, and the undo records that take it back
    out (oldest first). ``_apply`` takes it whole or undoes it."""

    version: int
    chunks: int = 0  # chunks 0 .. chunks - 1 are written
    parts: int = 0  # their parts, in chunk order
    undo: list[tuple[np.ndarray, Undo]] = field(default_factory=list)
    seconds: float = 0.0  # spent writing them
    # The tensors written, in the order they came: a rank's parts follow its image's order,
    # a tensor's blocks together, so each but the last is finished.
    names: list[str] = field(default_factory=list)
    whole: bool = False  # every chunk written (the last one named the count)


@dataclass
class RankStream:
    """What has arrived from one learner rank and not been applied yet."""

    # version -> chunk -> message
    diffs: dict[int, dict[int, ChunkMessage]] = field(default_factory=dict)
    anchor: dict[int, ChunkMessage] = field(default_factory=dict)  # chunk -> msg, one version
    anchor_requested_at: float | None = None
    last_seen: tuple[int, int, int] | None = None  # (version, chunk, num_chunks) of last diff
    lost: int = -1  # newest version some of whose chunks were provably dropped
    last_arrival: float = field(default_factory=time.monotonic)
    # The rows failed a whole-image verification: only an anchor (at our version or later) may
    # move them; their diffs chain from rows we know are wrong.
    repair: bool = False
    ahead: AheadWrite | None = None  # the diff from the version held, written as it arrives

    @staticmethod
    def _complete(chunks: dict[int, ChunkMessage]) -> list[ChunkMessage] | None:
        if not chunks:
            return None
        n = max(m.header.num_chunks for m in chunks.values())  # 0 until the last is in
        if n == 0 or len(chunks) != n or any(i not in chunks for i in range(n)):
            return None
        return [chunks[i] for i in range(n)]

    def complete_anchor(self) -> list[ChunkMessage] | None:
        return self._complete(self.anchor)

    def track(self, diff: WeightDiff) -> None:
        """Notice holes in this rank's (in-order) chunk sequence."""
        prev, self.last_seen = self.last_seen, (diff.version, diff.chunk, diff.num_chunks)
        if prev is None:
            if diff.chunk != 0:
                self.lost = max(self.lost, diff.version)
            return
        version, chunk, num_chunks = prev
        last = num_chunks == chunk + 1  # a streamed diff's earlier chunks say 0
        if diff.version == version and diff.chunk == chunk + 1:
            return
        if diff.version > version and diff.chunk == 0 and last:
            return
        if not last:
            self.lost = max(self.lost, version)
        if diff.version != version and diff.chunk != 0:
            self.lost = max(self.lost, diff.version)

    def paths(self, current: int) -> dict[int, tuple[Steps, bool]]:
        """version -> (the parts that bring these rows from ``current`` there, anchor used?)."""
        by_base: dict[int, VersionStep] = {}
        for version, chunks in self.diffs.items():
            complete = self._complete(chunks)
            if complete is not None:
                base = complete[0].header.base_version
                parts = [p for m in complete for p in m.parts]
                by_base[base] = VersionStep(version, parts, complete[-1].header.image_checksum)
        starts: list[tuple[int, Steps, bool]] = []
        if not self.repair:
            starts.append((current, [], False))
        anchor = self.complete_anchor()
        if anchor is not None:
            version = anchor[0].header.version
            if version > current or (self.repair and version == current):
                step = VersionStep(version, [p for m in anchor for p in m.parts])
                starts.append((version, [step], True))
        if not starts:  # waiting for a repair anchor: the rows stay where they are
            return {current: ([], False)}
        out: dict[int, tuple[Steps, bool]] = {}
        for version, steps, used_anchor in starts:
            while version not in out:
                out[version] = (steps, used_anchor)
                if version not in by_base:
                    break
                step = by_base[version]
                version, steps = step.version, [*steps, step]
        return out
