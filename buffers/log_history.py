"""What a shard's log says happened: one ordered pass over its segments (``replay``) gives
each group row's fate (live, consumed, a duplicate), the tallies, and each learner client's
last take; the readers below use it to yield the payloads of the rows wanted (``scan_shard``
for the CLI and the tests, ``DurableLog.recover*`` for a restarting shard). Reads without
the writer's lock, so a reader beside a live writer sees a prefix."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from streamrl.protocol import TrajectoryGroup
from streamrl.transport import DECODE_ERRORS

from .delivery import Delivered
from .log_segments import (
    KIND_CONSUMED,
    KIND_GROUP,
    KIND_REFUSED,
    KIND_TAKEN,
    TALLIES_KEY,
    current_schema,
    list_segments,
    live_segments,
    read_segment,
    read_segments,
    segment_metadata,
)
from .takes import LastTakes

log = logging.getLogger(__name__)

LIVE, CONSUMED, DUPLICATE = 0, 1, 2  # a group row's fate


@dataclass
class Tallies:
    """What one shard's log says happened, over every process that wrote it.

    ``received``: groups that arrived and decoded (appended, or refused on arrival);
    ``removed``: groups that left, by reason (``consumed`` = used up by learners, or a drop
    reason); ``remaining``: appended and not yet removed. ``received == sum(removed) +
    remaining`` always holds.
    """

    received: int = 0
    removed: dict[str, int] = field(default_factory=dict)
    remaining: int = 0
    # Which generator groups arrived (appended or refused), for acknowledged delivery.
    delivered: Delivered = field(default_factory=Delivered)

    def remove(self, reason: str, n: int = 1) -> None:
        self.removed[reason] = self.removed.get(reason, 0) + n

    def receive(self, group_ids: list[str]) -> None:
        self.received += len(group_ids)
        for gid in group_ids:
            self.delivered.add(gid)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "received": self.received,
                "removed": self.removed,
                "delivered": self.delivered.to_json(),
            }
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Tallies:
        data = json.loads(raw)
        removed = {str(k): int(v) for k, v in data["removed"].items()}
        return cls(
            int(data["received"]), removed, 0, Delivered.from_json(data.get("delivered", {}))
        )


@dataclass
class History:
    """What one ordered pass over a shard's log found (``replay``)."""

    fates: list[int]  # of every group row, in log order: LIVE, CONSUMED or DUPLICATE
    tallies: Tallies
    rows: dict[str, int]  # group id -> its latest counted group row
    removed_reason: dict[str, str]  # group id -> why it left (consumed and dropped groups)
    takes: LastTakes[str]  # each client's last take: the ids of the groups it got


def replay(segments: list[Path]) -> History:
    """Replay appends, marks and takes in log order. A compaction segment starts from the
    tallies in its metadata; its group rows are the groups then remaining, and those of the
    takes it kept (followed by their marks)."""
    fates: list[int] = []
    live: dict[str, int] = {}  # group_id -> row of its unconsumed append
    rows: dict[str, int] = {}
    removed_reason: dict[str, str] = {}
    takes: LastTakes[str] = LastTakes()
    tallies = Tallies()
    for index, path in enumerate(segments):
        counted = True
        if index == 0 and path.name.endswith(".compact.arrows"):
            raw = segment_metadata(path).get(TALLIES_KEY)
            if raw is not None:  # compacted by a format-1 writer: its history is gone
                tallies, counted = Tallies.from_json(raw), False
        for batch in read_segment(path):
            kinds = batch.column("kind").to_pylist()
            ids = batch.column("group_id").to_pylist()
            batch = current_schema(batch)
            reasons = batch.column("reason").to_pylist()
            for row, (kind, gid, reason) in enumerate(zip(kinds, ids, reasons, strict=True)):
                if kind == KIND_GROUP:
                    tallies.delivered.add(gid)
                    if gid in live:
                        fates.append(DUPLICATE)
                    else:
                        live[gid] = rows[gid] = len(fates)
                        fates.append(LIVE)
                        tallies.received += counted
                elif kind == KIND_CONSUMED and gid in live:
                    fates[live.pop(gid)] = CONSUMED
                    removed_reason[gid] = reason = reason or "consumed"
                    tallies.remove(reason)
                elif kind == KIND_REFUSED:
                    tallies.receive([gid])
                    tallies.remove(reason or "refused")
                elif kind == KIND_TAKEN and gid in rows:
                    client = batch.column("client")[row].as_py()
                    request_id = batch.column("request_id")[row].as_py()
                    if client is not None and request_id is not None:
                        takes.extend(client, request_id, [gid])
    tallies.remaining = len(live)
    return History(fates, tallies, rows, removed_reason, takes)


def group_batches(
    segments: list[Path], fates: list[int]
) -> Iterator[tuple[pa.RecordBatch, list[int]]]:
    """The group rows of ``segments``, batch by batch, each with its rows' fates. Rows a live
    writer appended after ``fates`` was computed are left out."""
    row = 0
    for batch in read_segments(segments):
        if row >= len(fates):
            return
        kinds = batch.column("kind")
        if pc.any(pc.not_equal(kinds, KIND_GROUP)).as_py():
            batch = batch.filter(pc.equal(kinds, KIND_GROUP))
        n = min(batch.num_rows, len(fates) - row)
        if n:
            yield batch.slice(0, n), fates[row : row + n]
            row += n


def group_payloads(
    segments: list[Path], fates: list[int], wanted: tuple[int, ...]
) -> Iterator[tuple[bytes, bool]]:
    """The payload of every group row whose fate is in ``wanted``, in log order, with whether
    it was consumed."""
    for batch, batch_fates in group_batches(segments, fates):
        payloads = batch.column("payload").to_pylist()
        for payload, fate in zip(payloads, batch_fates, strict=True):
            if fate in wanted:
                yield payload, fate == CONSUMED


def payloads_at_rows(
    segments: list[Path], fates: list[int], rows: set[int]
) -> Iterator[tuple[int, bytes]]:
    """``(row, payload)`` of the group rows numbered in ``rows``."""
    row = 0
    for batch, batch_fates in group_batches(segments, fates):
        n = len(batch_fates)
        wanted = [i for i in range(n) if row + i in rows]
        if wanted:
            payloads = batch.column("payload")
            for i in wanted:
                yield row + i, payloads[i].as_py()
        row += n


def scan_shard(shard_dir: Path) -> Iterator[tuple[TrajectoryGroup, bool]]:
    """Every group in one shard's log, in append order, with whether it was consumed.

    Reads without taking the lock, so it works beside a live writer (it sees a prefix). A
    group id appended again while still unconsumed is a duplicate and is skipped. Two passes
    over the segments (fates first, then payloads), so memory holds one batch at a time.
    """
    yield from scan_groups(Path(shard_dir), (LIVE, CONSUMED))


def scan_groups(
    shard_dir: Path, wanted: tuple[int, ...], skipped: list[int] | None = None
) -> Iterator[tuple[TrajectoryGroup, bool]]:
    """``_scan_payloads``, decoded. A payload that does not decode is skipped and counted (in
    ``skipped[0]``), and the scan logs one warning at its end with the count and first error."""
    decoder = msgspec.msgpack.Decoder(TrajectoryGroup)
    failed, first_error = 0, None
    for payload, consumed in _scan_payloads(shard_dir, wanted):
        try:
            group = decoder.decode(payload)
        except DECODE_ERRORS as exc:
            failed, first_error = failed + 1, first_error or exc
            continue
        yield group, consumed
    if failed:
        log.warning(
            "%s: skipped %d logged groups that do not decode (first: %s: %s)",
            shard_dir,
            failed,
            type(first_error).__name__,
            first_error,
        )
        if skipped is not None:
            skipped[0] += failed


def _scan_payloads(shard_dir: Path, wanted: tuple[int, ...]) -> Iterator[tuple[bytes, bool]]:
    """``group_payloads`` of one shard folder's log, replayed first for the fates."""
    segments = live_segments(shard_dir)
    yield from group_payloads(segments, replay(segments).fates, wanted)


def shard_dirs(directory: Path) -> list[Path]:
    """The ``shard-<id>`` folders under ``directory`` that hold log segments, by shard id."""
    found = []
    for path in Path(directory).glob("shard-*"):
        suffix = path.name.removeprefix("shard-")
        if path.is_dir() and suffix.isdigit() and list_segments(path):
            found.append((int(suffix), path))
    return [path for _, path in sorted(found)]
