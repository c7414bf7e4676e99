"""The durable log of one buffer shard: every accepted group, and which ones were consumed.

Layout: ``<directory>/shard-<id>/`` holds numbered segment files, each one Arrow IPC *stream*
(not the IPC file format: a stream has no footer, so a reader gets every complete record
batch of a file whose writer was killed mid-write and simply stops at the torn tail):

    00000001.arrows            written by the first process
    00000002.arrows            the next process start (a segment is never appended to again)
    00000003.compact.arrows    a compaction: supersedes every lower-numbered segment
    LOCK                       flock'ed by the one live writer of the shard

Format choice: one row per *group* with a ``payload`` column holding the group as msgspec
msgpack (exactly the wire encoding, so the shard logs the frame it received, with no
encoding at all; token arrays are raw bytes in it, so they round-trip bit-exact), plus a few
flat, queryable columns (ids, versions, token count, mean reward, timestamps). ``export``
turns the payloads into a flat Parquet table offline. A payload that no longer decodes (a
corrupted or foreign row) is skipped and counted, logged once per read: one bad row must not
stop a shard from restarting.

Consumption marks live in the same stream (``kind`` = 1: ``group_id`` and the ``reason`` it
left, ``consumed`` or a drop reason), so one ordered pass over the segments replays history
exactly: appends add a group, marks remove it. A group refused on arrival (stale, duplicate,
...) is one ``kind`` = 2 row (id and reason, no payload): it never enters the live set, but it
is counted. So the log alone answers, across any number of restarts of the shard,
``received == sum(removed by reason) + remaining`` (``Tallies``); a compaction keeps the
tallies of what it drops in its schema metadata. Format 1 logs (no ``reason``) still read,
their marks counted as ``consumed``.

Takes (``kind`` = 3: ``group_id``, ``client``, ``request_id``) record which groups a learner
client's batch request got, so a restarted shard answers a repeat of each client's last take
with the same groups (``buffers.takes``); a compaction keeps those takes and their groups'
payloads. Format 2 logs (no takes) still read.

Durability: ``append``/``append_many``/``mark_consumed`` return after the bytes are handed to
the OS (the file is unbuffered), so they survive the process being killed; ``fsync=True``
also survives a machine crash, at the cost of an fsync per call. The shard server appends a
group before it counts it accepted. One writer per shard directory (enforced by ``LOCK``);
not thread-safe.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from streamrl.files import atomic_writer, fsync_directory
from streamrl.protocol import TrajectoryGroup
from streamrl.transport import DECODE_ERRORS

from .delivery import Delivered
from .takes import LastTakes

log = logging.getLogger(__name__)

FORMAT_KEY, FORMAT_VERSION = b"streamrl.log", b"3"
READABLE_FORMATS = (b"1", b"2", FORMAT_VERSION)
TALLIES_KEY = b"streamrl.tallies"  # on a compaction: the tallies as of the rows it dropped
KIND_GROUP, KIND_CONSUMED, KIND_REFUSED, KIND_TAKEN = 0, 1, 2, 3
SCHEMA = pa.schema(
    [
        ("kind", pa.int8()),  # KIND_GROUP, KIND_CONSUMED, KIND_REFUSED or KIND_TAKEN
        ("group_id", pa.string()),
        # The rest, but ``reason``, ``client`` and ``request_id``, are null on every row kind
        # but KIND_GROUP.
        ("prompt_id", pa.string()),
        ("min_version", pa.int64()),
        ("max_version", pa.int64()),
        ("num_trajectories", pa.int32()),
        ("num_tokens", pa.int64()),
        ("mean_reward", pa.float64()),
        ("created_at", pa.float64()),
        ("finished_at", pa.float64()),
        ("payload", pa.large_binary()),  # msgspec msgpack of the TrajectoryGroup
        ("reason", pa.string()),  # why a group left or was refused; null on KIND_GROUP rows
        ("client", pa.string()),  # KIND_TAKEN: the learner client that took the group
        ("request_id", pa.int64()),  # KIND_TAKEN: the client's request that took it
    ],
    metadata={FORMAT_KEY: FORMAT_VERSION},
)
_SEGMENT_NAME = re.compile(r"^(\d{8})(\.compact)?\.arrows$")
_LIVE, _CONSUMED, _DUPLICATE = 0, 1, 2
# What pyarrow raises on a truncated stream: ArrowInvalid inside metadata, OSError inside a body.
_TORN = (pa.ArrowInvalid, OSError)


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


class LoggedGroup(Protocol):
    """What ``append_many`` reads of a group besides its payload (``TrajectoryGroup`` is one;
    so is the shard's ``frames.StoredGroup``)."""

    @property
    def group_id(self) -> str: ...
    @property
    def prompt_id(self) -> str: ...
    @property
    def min_version(self) -> int: ...
    @property
    def max_version(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def rewards(self) -> list[float]: ...
    @property
    def created_at(self) -> float: ...
    @property
    def finished_at(self) -> float: ...


class DurableLog:
    """Append-only log of the groups one shard accepted, with consumption marks.

    Invariant: ``recover()`` returns exactly the groups appended and not yet marked consumed,
    each once, in append order, whatever point the previous process was killed at.

    Example::

        log = DurableLog(run_dir / "buffer", shard_id=0)
        log.append_many([g1, g2, g3])      # on disk before the shard counts them accepted
        log.mark_consumed([g2.group_id])
        # ... process killed, restarted ...
        DurableLog(run_dir / "buffer", 0).recover()   # [g1, g3]
    """

    def __init__(self, directory: Path, shard_id: int, *, fsync: bool = False) -> None:
        self.shard_dir = Path(directory) / f"shard-{shard_id}"
        self.shard_dir.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync
        self._lock = open(self.shard_dir / "LOCK", "a+b")  # held (and flock'ed) until close()
        try:
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise RuntimeError(f"{self.shard_dir} is already open by another writer") from None
        self._remove_leftovers()
        # Counted from the log when first asked for (``recover_payloads`` counts them in its
        # own pass), then kept current by every write.
        self._tallies: Tallies | None = None
        # The log as replayed by the last recover_* call, until the next write or compaction:
        # a restarting shard asks for its unconsumed groups and its clients' last takes.
        self._recovered: tuple[list[Path], _History] | None = None
        segments = _segments(self.shard_dir)
        self._next_number = (segments[-1][0] + 1) if segments else 1
        self._file: BinaryIO | None = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._encoder = msgspec.msgpack.Encoder()
        self._closed = False
        # Logged groups whose payload did not decode, skipped by the last recover().
        self.undecodable = 0

    # ------------------------------------------------------------------ writing

    def append(self, group: TrajectoryGroup) -> None:
        self.append_many([group])

    def append_many(
        self, groups: Sequence[LoggedGroup], payloads: list[bytes] | None = None
    ) -> None:
        """Log ``groups`` as one record batch. ``payloads`` must be the groups' msgspec
        msgpack encodings (e.g. the frames they arrived in); without them ``groups`` must be
        ``TrajectoryGroup``s, encoded here."""
        if not groups:
            return
        if payloads is None:
            payloads = [self._encoder.encode(g) for g in groups]
        elif len(payloads) != len(groups):
            raise ValueError(f"{len(groups)} groups but {len(payloads)} payloads")
        n = len(groups)
        columns = [
            pa.array([KIND_GROUP] * n, pa.int8()),
            pa.array([g.group_id for g in groups], pa.string()),
            pa.array([g.prompt_id for g in groups], pa.string()),
            pa.array([g.min_version for g in groups], pa.int64()),
            pa.array([g.max_version for g in groups], pa.int64()),
            pa.array([len(g.rewards) for g in groups], pa.int32()),
            pa.array([g.num_tokens for g in groups], pa.int64()),
            pa.array([_mean_reward(g) for g in groups], pa.float64()),
            pa.array([g.created_at for g in groups], pa.float64()),
            pa.array([g.finished_at for g in groups], pa.float64()),
            pa.array(payloads, pa.large_binary()),
            *(pa.nulls(n, f.type) for f in list(SCHEMA)[-3:]),
        ]
        self._write(pa.record_batch(columns, schema=SCHEMA))
        if self._tallies is not None:
            self._tallies.receive([g.group_id for g in groups])
            self._tallies.remaining += n

    def mark_consumed(self, group_ids: list[str], reasons: list[str] | None = None) -> None:
        """Durably record that these logged groups left the shard: used up (``consumed``,
        the default) or dropped (``reasons[i]``, a drop reason)."""
        if not group_ids:
            return
        reasons = reasons or ["consumed"] * len(group_ids)
        self._write(_reason_rows(KIND_CONSUMED, group_ids, reasons))
        if self._tallies is not None:
            for reason in reasons:
                self._tallies.remove(reason)
            self._tallies.remaining -= len(group_ids)

    def record_take(self, client: str, request_id: int, group_ids: list[str]) -> None:
        """Durably record that ``client``'s request ``request_id`` got these groups (log it
        before the reply leaves, as the marks)."""
        if group_ids:
            self._write(_take_rows(client, request_id, group_ids))

    def refuse(self, group_ids: list[str], reasons: list[str]) -> None:
        """Durably record groups that arrived and were dropped at once (never stored)."""
        if not group_ids:
            return
        self._write(_reason_rows(KIND_REFUSED, group_ids, reasons))
        if self._tallies is not None:
            self._tallies.receive(group_ids)
            for reason in reasons:
                self._tallies.remove(reason)

    @property
    def tallies(self) -> Tallies:
        """What the log says happened, over every process that wrote it (``Tallies``)."""
        if self._tallies is None:  # every write so far is on disk: counting it now is exact
            self._tallies = _replay(_live_segments(self.shard_dir)).tallies
        return self._tallies

    def _write(self, batch: pa.RecordBatch) -> None:
        if self._closed:
            raise ValueError(f"durable log {self.shard_dir} is closed")
        self._recovered = None
        if self._writer is None:
            self._open_segment()
        assert self._writer is not None and self._file is not None
        try:
            self._writer.write_batch(batch)  # unbuffered file: the bytes are with the OS now
            if self._fsync:
                os.fsync(self._file.fileno())
        except BaseException:
            # A half-written batch ends what readers can see of this segment: abandon it so
            # that later appends land in a fresh, readable segment.
            self._file.close()
            self._file, self._writer = None, None
            raise

    def _open_segment(self) -> None:
        path = self.shard_dir / f"{self._next_number:08d}.arrows"
        self._next_number += 1
        self._file = open(path, "xb", buffering=0)
        self._writer = pa.ipc.new_stream(self._file, SCHEMA)
        if self._fsync:
            os.fsync(self._file.fileno())
            fsync_directory(self.shard_dir)

    def _close_segment(self) -> None:
        if self._writer is not None:
            self._writer.close()  # writes the end-of-stream marker
            self._writer = None
        if self._file is not None:
            if self._fsync:
                os.fsync(self._file.fileno())
            self._file.close()
            self._file = None

    # ------------------------------------------------------------------ reading

    def recover(self) -> list[TrajectoryGroup]:
        """Every appended, unconsumed group, in append order, each once (payloads that do not
        decode are skipped, counted in ``undecodable``)."""
        skipped = [0]
        groups = [group for group, _ in _scan(self.shard_dir, (_LIVE,), skipped)]
        self.undecodable = skipped[0]
        return groups

    def recover_payloads(self) -> list[bytes]:
        """The payloads (msgpack ``TrajectoryGroup``s) of what ``recover`` returns, not
        decoded (nor checked: whoever decodes them counts what fails)."""
        segments, history = self._replayed()
        if self._tallies is None:
            self._tallies = history.tallies
        return [payload for payload, _ in _payloads(segments, history.fates, (_LIVE,))]

    def recover_takes(self) -> LastTakes[bytes]:
        """Each client's last take, with the payloads of its groups in the order they were
        taken (``buffers.takes``). A group whose payload a format-2 compaction dropped is left
        out of its take."""
        segments, history = self._replayed()
        rows = {history.rows[gid] for _, take in history.takes.items() for gid in take.items}
        payloads = dict(_payloads_at(segments, history.fates, rows)) if rows else {}
        out: LastTakes[bytes] = LastTakes()
        for client, take in history.takes.items():
            found = [payloads.get(history.rows[gid]) for gid in take.items]
            out.put(client, take.request_id, [p for p in found if p is not None])
        return out

    def _replayed(self) -> tuple[list[Path], _History]:
        if self._recovered is None:
            segments = _live_segments(self.shard_dir)
            self._recovered = segments, _replay(segments)
        return self._recovered

    def iter_all(self) -> Iterator[TrajectoryGroup]:
        """Every group still in the log, consumed or not, in append order (a compaction
        removes the consumed ones for good)."""
        for group, _ in scan_shard(self.shard_dir):
            yield group

    # ------------------------------------------------------------------ maintenance

    def compact(self) -> None:
        """Rewrite the log keeping only unconsumed groups, and each client's last take (its
        rows, and the groups it took, with their consumption marks).

        Atomic: the new segment is written under a temporary name, fsynced, then renamed to
        ``<n>.compact.arrows``; from that rename on, readers ignore every older segment, so a
        crash at any point leaves either the old log or the compacted one. Older segments are
        deleted afterwards (or at the next open, if the process dies first). The next append
        opens a fresh segment.
        """
        self._close_segment()
        self._recovered = None  # its row numbers end with the old segments
        segments = _live_segments(self.shard_dir)
        history = _replay(segments)
        fates, tallies = history.fates, history.tallies
        # Consumed groups of the kept takes stay, as rows that count themselves on replay:
        # the tallies in the metadata leave them out (they only count what was dropped).
        kept_gone = {
            gid: history.removed_reason[gid]
            for _, take in history.takes.items()
            for gid in take.items
            if fates[history.rows[gid]] == _CONSUMED
        }
        kept_rows = {history.rows[gid] for gid in kept_gone}
        for reason in kept_gone.values():
            tallies.remove(reason, -1)
        number = self._next_number
        self._next_number += 1
        final = self.shard_dir / f"{number:08d}.compact.arrows"
        with atomic_writer(final, durable=True) as f:
            schema = SCHEMA.with_metadata({**SCHEMA.metadata, TALLIES_KEY: tallies.to_json()})
            with pa.ipc.new_stream(f, schema) as writer:
                row = 0
                for batch, batch_fates in _group_batches(segments, fates):
                    batch = _current_schema(batch)
                    keep = [
                        fate == _LIVE or row + i in kept_rows for i, fate in enumerate(batch_fates)
                    ]
                    row += len(batch_fates)
                    if all(keep):
                        writer.write_batch(batch)
                    elif any(keep):
                        writer.write_batch(batch.filter(pa.array(keep)))
                if kept_gone:
                    marks = _reason_rows(KIND_CONSUMED, list(kept_gone), list(kept_gone.values()))
                    writer.write_batch(marks)
                for client, take in history.takes.items():
                    writer.write_batch(_take_rows(client, take.request_id, take.items))
        self._remove_leftovers()

    def _remove_leftovers(self) -> None:
        """Delete temporary files and segments superseded by a compaction."""
        for path in self.shard_dir.glob("*.tmp"):
            path.unlink()
        live = set(_live_segments(self.shard_dir))
        for _, _, path in _segments(self.shard_dir):
            if path not in live:
                path.unlink()
        fsync_directory(self.shard_dir)

    def close(self) -> None:
        if self._closed:
            return
        self._close_segment()
        self._closed = True
        self._lock.close()  # releases the flock

    def __enter__(self) -> DurableLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- helpers


def shard_dirs(directory: Path) -> list[Path]:
    """The ``shard-<id>`` folders under ``directory`` that hold log segments, by shard id."""
    found = []
    for path in Path(directory).glob("shard-*"):
        suffix = path.name.removeprefix("shard-")
        if path.is_dir() and suffix.isdigit() and _segments(path):
            found.append((int(suffix), path))
    return [path for _, path in sorted(found)]


def scan_shard(shard_dir: Path) -> Iterator[tuple[TrajectoryGroup, bool]]:
    """Every group in one shard's log, in append order, with whether it was consumed.

    Reads without taking the lock, so it works beside a live writer (it sees a prefix). A
    group id appended again while still unconsumed is a duplicate and is skipped. Two passes
    over the segments (fates first, then payloads), so memory holds one batch at a time.
    """
    yield from _scan(Path(shard_dir), (_LIVE, _CONSUMED))


def _scan(
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
    """The payload of every group row whose fate is in ``wanted``, in log order, with whether
    it was consumed."""
    segments = _live_segments(shard_dir)
    yield from _payloads(segments, _replay(segments).fates, wanted)


def _payloads(
    segments: list[Path], fates: list[int], wanted: tuple[int, ...]
) -> Iterator[tuple[bytes, bool]]:
    for batch, batch_fates in _group_batches(segments, fates):
        payloads = batch.column("payload").to_pylist()
        for payload, fate in zip(payloads, batch_fates, strict=True):
            if fate in wanted:
                yield payload, fate == _CONSUMED


def _payloads_at(
    segments: list[Path], fates: list[int], rows: set[int]
) -> Iterator[tuple[int, bytes]]:
    """``(row, payload)`` of the group rows numbered in ``rows``."""
    row = 0
    for batch, batch_fates in _group_batches(segments, fates):
        n = len(batch_fates)
        wanted = [i for i in range(n) if row + i in rows]
        if wanted:
            payloads = batch.column("payload")
            for i in wanted:
                yield row + i, payloads[i].as_py()
        row += n


@dataclass
class _History:
    """What one ordered pass over a shard's log found (``_replay``)."""

    fates: list[int]  # of every group row, in log order: _LIVE, _CONSUMED or _DUPLICATE
    tallies: Tallies
    rows: dict[str, int]  # group id -> its latest counted group row
    removed_reason: dict[str, str]  # group id -> why it left (consumed and dropped groups)
    takes: LastTakes[str]  # each client's last take: the ids of the groups it got


def _replay(segments: list[Path]) -> _History:
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
            raw = _metadata(path).get(TALLIES_KEY)
            if raw is not None:  # compacted by a format-1 writer: its history is gone
                tallies, counted = Tallies.from_json(raw), False
        for batch in _read_segment(path):
            kinds = batch.column("kind").to_pylist()
            ids = batch.column("group_id").to_pylist()
            batch = _current_schema(batch)
            reasons = batch.column("reason").to_pylist()
            for row, (kind, gid, reason) in enumerate(zip(kinds, ids, reasons, strict=True)):
                if kind == KIND_GROUP:
                    tallies.delivered.add(gid)
                    if gid in live:
                        fates.append(_DUPLICATE)
                    else:
                        live[gid] = rows[gid] = len(fates)
                        fates.append(_LIVE)
                        tallies.received += counted
                elif kind == KIND_CONSUMED and gid in live:
                    fates[live.pop(gid)] = _CONSUMED
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
    return _History(fates, tallies, rows, removed_reason, takes)


def _id_rows(kind: int, group_ids: list[str], columns: dict[str, pa.Array]) -> pa.RecordBatch:
    """Rows of ``kind`` that carry a group id and the given ``columns`` (marks, refusals,
    takes); every other column null."""
    n = len(group_ids)
    given = {"kind": pa.array([kind] * n, pa.int8()), "group_id": pa.array(group_ids, pa.string())}
    given.update(columns)
    return pa.record_batch([given.get(f.name, pa.nulls(n, f.type)) for f in SCHEMA], schema=SCHEMA)


def _reason_rows(kind: int, group_ids: list[str], reasons: list[str]) -> pa.RecordBatch:
    """Marks (KIND_CONSUMED) or refusals (KIND_REFUSED): ids and reasons."""
    return _id_rows(kind, group_ids, {"reason": pa.array(reasons, pa.string())})


def _take_rows(client: str, request_id: int, group_ids: list[str]) -> pa.RecordBatch:
    """One take (KIND_TAKEN): the ids of the groups ``client``'s ``request_id`` got."""
    n = len(group_ids)
    columns = {"client": pa.array([client] * n, pa.string())}
    columns["request_id"] = pa.array([request_id] * n, pa.int64())
    return _id_rows(KIND_TAKEN, group_ids, columns)


def _current_schema(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch of an older format (format 1: no ``reason``; 2: no ``client``, ``request_id``)
    in today's schema, its missing columns null."""
    names = batch.schema.names
    if names == SCHEMA.names:
        return batch
    n = batch.num_rows
    columns = [batch.column(f.name) if f.name in names else pa.nulls(n, f.type) for f in SCHEMA]
    return pa.record_batch(columns, schema=SCHEMA)


def _metadata(path: Path) -> dict[bytes, bytes]:
    with pa.OSFile(str(path)) as source:
        try:
            return dict(pa.ipc.open_stream(source).schema.metadata or {})
        except _TORN:
            return {}


def _group_batches(
    segments: list[Path], fates: list[int]
) -> Iterator[tuple[pa.RecordBatch, list[int]]]:
    """The group rows of ``segments``, batch by batch, each with its rows' fates. Rows a live
    writer appended after ``fates`` was computed are left out."""
    row = 0
    for batch in _read_segments(segments):
        if row >= len(fates):
            return
        kinds = batch.column("kind")
        if pc.any(pc.not_equal(kinds, KIND_GROUP)).as_py():
            batch = batch.filter(pc.equal(kinds, KIND_GROUP))
        n = min(batch.num_rows, len(fates) - row)
        if n:
            yield batch.slice(0, n), fates[row : row + n]
            row += n


def _read_segments(segments: list[Path]) -> Iterator[pa.RecordBatch]:
    for path in segments:
        yield from _read_segment(path)


def _read_segment(path: Path) -> Iterator[pa.RecordBatch]:
    """Every complete record batch of one segment; a torn tail ends the segment quietly."""
    with pa.OSFile(str(path)) as source:
        try:
            reader = pa.ipc.open_stream(source)
        except _TORN:
            log.warning("%s: no complete schema (torn at start); skipped", path)
            return
        metadata = reader.schema.metadata or {}
        if metadata.get(FORMAT_KEY) not in READABLE_FORMATS:
            raise ValueError(f"{path} is not a streamrl buffer log (format {metadata!r})")
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
            except _TORN as exc:
                log.warning("%s: torn tail ignored (%s)", path, exc)
                return
            yield batch


def _segments(shard_dir: Path) -> list[tuple[int, bool, Path]]:
    """``(number, is_compaction, path)`` of every segment, by number."""
    found = []
    for path in shard_dir.iterdir():
        match = _SEGMENT_NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), match.group(2) is not None, path))
    return sorted(found)


def _live_segments(shard_dir: Path) -> list[Path]:
    """The segments that make up the log: from the last compaction on."""
    segments = _segments(shard_dir)
    start = max((i for i, (_, compact, _) in enumerate(segments) if compact), default=0)
    return [path for _, _, path in segments[start:]]


def _mean_reward(group: LoggedGroup) -> float | None:
    rewards = group.rewards
    return sum(rewards) / len(rewards) if rewards else None
