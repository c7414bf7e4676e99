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

Parts: ``log_segments`` (the schema, the rows of each kind, the segment files) and
``log_history`` (one ordered pass over the segments: fates, tallies, takes; the readers).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import msgspec
import pyarrow as pa

from streamrl.files import atomic_writer, fsync_directory
from streamrl.protocol import TrajectoryGroup

from .log_history import (
    CONSUMED,
    LIVE,
    History,
    Tallies,
    group_batches,
    group_payloads,
    payloads_at_rows,
    replay,
    scan_groups,
    scan_shard,
)
from .log_segments import (
    KIND_CONSUMED,
    KIND_REFUSED,
    SCHEMA,
    TALLIES_KEY,
    LoggedGroup,
    current_schema,
    group_rows,
    list_segments,
    live_segments,
    reason_rows,
    take_rows,
)
from .takes import LastTakes


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
        self._recovered: tuple[list[Path], History] | None = None
        segments = list_segments(self.shard_dir)
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
        self._write(group_rows(groups, payloads))
        if self._tallies is not None:
            self._tallies.receive([g.group_id for g in groups])
            self._tallies.remaining += len(groups)

    def mark_consumed(self, group_ids: list[str], reasons: list[str] | None = None) -> None:
        """Durably record that these logged groups left the shard: used up (``consumed``,
        the default) or dropped (``reasons[i]``, a drop reason)."""
        if not group_ids:
            return
        reasons = reasons or ["consumed"] * len(group_ids)
        self._write(reason_rows(KIND_CONSUMED, group_ids, reasons))
        if self._tallies is not None:
            for reason in reasons:
                self._tallies.remove(reason)
            self._tallies.remaining -= len(group_ids)

    def record_take(self, client: str, request_id: int, group_ids: list[str]) -> None:
        """Durably record that ``client``'s request ``request_id`` got these groups (log it
        before the reply leaves, as the marks)."""
        if group_ids:
            self._write(take_rows(client, request_id, group_ids))

    def refuse(self, group_ids: list[str], reasons: list[str]) -> None:
        """Durably record groups that arrived and were dropped at once (never stored)."""
        if not group_ids:
            return
        self._write(reason_rows(KIND_REFUSED, group_ids, reasons))
        if self._tallies is not None:
            self._tallies.receive(group_ids)
            for reason in reasons:
                self._tallies.remove(reason)

    @property
    def tallies(self) -> Tallies:
        """What the log says happened, over every process that wrote it (``Tallies``)."""
        if self._tallies is None:  # every write so far is on disk: counting it now is exact
            self._tallies = replay(live_segments(self.shard_dir)).tallies
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
        groups = [group for group, _ in scan_groups(self.shard_dir, (LIVE,), skipped)]
        self.undecodable = skipped[0]
        return groups

    def recover_payloads(self) -> list[bytes]:
        """The payloads (msgpack ``TrajectoryGroup``s) of what ``recover`` returns, not
        decoded (nor checked: whoever decodes them counts what fails)."""
        segments, history = self._replayed()
        if self._tallies is None:
            self._tallies = history.tallies
        return [payload for payload, _ in group_payloads(segments, history.fates, (LIVE,))]

    def recover_takes(self) -> LastTakes[bytes]:
        """Each client's last take, with the payloads of its groups in the order they were
        taken (``buffers.takes``). A group whose payload a format-2 compaction dropped is left
        out of its take."""
        segments, history = self._replayed()
        rows = {history.rows[gid] for _, take in history.takes.items() for gid in take.items}
        payloads = dict(payloads_at_rows(segments, history.fates, rows)) if rows else {}
        out: LastTakes[bytes] = LastTakes()
        for client, take in history.takes.items():
            found = [payloads.get(history.rows[gid]) for gid in take.items]
            out.put(client, take.request_id, [p for p in found if p is not None])
        return out

    def _replayed(self) -> tuple[list[Path], History]:
        if self._recovered is None:
            segments = live_segments(self.shard_dir)
            self._recovered = segments, replay(segments)
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
        segments = live_segments(self.shard_dir)
        history = replay(segments)
        fates, tallies = history.fates, history.tallies
        # Consumed groups of the kept takes stay, as rows that count themselves on replay:
        # the tallies in the metadata leave them out (they only count what was dropped).
        kept_gone = {
            gid: history.removed_reason[gid]
            for _, take in history.takes.items()
            for gid in take.items
            if fates[history.rows[gid]] == CONSUMED
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
                for batch, batch_fates in group_batches(segments, fates):
                    batch = current_schema(batch)
                    keep = [
                        fate == LIVE or row + i in kept_rows for i, fate in enumerate(batch_fates)
                    ]
                    row += len(batch_fates)
                    if all(keep):
                        writer.write_batch(batch)
                    elif any(keep):
                        writer.write_batch(batch.filter(pa.array(keep)))
                if kept_gone:
                    marks = reason_rows(KIND_CONSUMED, list(kept_gone), list(kept_gone.values()))
                    writer.write_batch(marks)
                for client, take in history.takes.items():
                    writer.write_batch(take_rows(client, take.request_id, take.items))
        self._remove_leftovers()

    def _remove_leftovers(self) -> None:
        """Delete temporary files and segments superseded by a compaction."""
        for path in self.shard_dir.glob("*.tmp"):
            path.unlink()
        live = set(live_segments(self.shard_dir))
        for _, _, path in list_segments(self.shard_dir):
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
