"""The buffer log's files and rows (the format ``durable_log``'s module doc describes): the
Arrow schema and its row kinds, the rows each kind is written as, and a shard folder's
segments, read batch by batch with a torn tail ending a segment quietly. No state: the writer
is ``DurableLog``, the reader of history ``log_history``."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

import pyarrow as pa

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
# What pyarrow raises on a truncated stream: ArrowInvalid inside metadata, OSError inside a body.
_TORN = (pa.ArrowInvalid, OSError)


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


def group_rows(groups: Sequence[LoggedGroup], payloads: list[bytes]) -> pa.RecordBatch:
    """Group rows (KIND_GROUP): each group's flat columns and its payload."""
    columns = {
        "prompt_id": pa.array([g.prompt_id for g in groups], pa.string()),
        "min_version": pa.array([g.min_version for g in groups], pa.int64()),
        "max_version": pa.array([g.max_version for g in groups], pa.int64()),
        "num_trajectories": pa.array([len(g.rewards) for g in groups], pa.int32()),
        "num_tokens": pa.array([g.num_tokens for g in groups], pa.int64()),
        "mean_reward": pa.array([_mean_reward(g) for g in groups], pa.float64()),
        "created_at": pa.array([g.created_at for g in groups], pa.float64()),
        "finished_at": pa.array([g.finished_at for g in groups], pa.float64()),
        "payload": pa.array(payloads, pa.large_binary()),
    }
    return _id_rows(KIND_GROUP, [g.group_id for g in groups], columns)


def _id_rows(kind: int, group_ids: list[str], columns: dict[str, pa.Array]) -> pa.RecordBatch:
    """Rows of ``kind`` (any of them) that carry a group id and the given ``columns``; every
    other column null."""
    n = len(group_ids)
    given = {"kind": pa.array([kind] * n, pa.int8()), "group_id": pa.array(group_ids, pa.string())}
    given.update(columns)
    return pa.record_batch(
        [given[f.name] if f.name in given else pa.nulls(n, f.type) for f in SCHEMA], schema=SCHEMA
    )


def reason_rows(kind: int, group_ids: list[str], reasons: list[str]) -> pa.RecordBatch:
    """Marks (KIND_CONSUMED) or refusals (KIND_REFUSED): ids and reasons."""
    return _id_rows(kind, group_ids, {"reason": pa.array(reasons, pa.string())})


def take_rows(client: str, request_id: int, group_ids: list[str]) -> pa.RecordBatch:
    """One take (KIND_TAKEN): the ids of the groups ``client``'s ``request_id`` got."""
    n = len(group_ids)
    columns = {"client": pa.array([client] * n, pa.string())}
    columns["request_id"] = pa.array([request_id] * n, pa.int64())
    return _id_rows(KIND_TAKEN, group_ids, columns)


def current_schema(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch of an older format (format 1: no ``reason``; 2: no ``client``, ``request_id``)
    in today's schema, its missing columns null."""
    names = batch.schema.names
    if names == SCHEMA.names:
        return batch
    n = batch.num_rows
    columns = [batch.column(f.name) if f.name in names else pa.nulls(n, f.type) for f in SCHEMA]
    return pa.record_batch(columns, schema=SCHEMA)


def read_segments(segments: list[Path]) -> Iterator[pa.RecordBatch]:
    for path in segments:
        yield from read_segment(path)


def read_segment(path: Path) -> Iterator[pa.RecordBatch]:
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


def segment_metadata(path: Path) -> dict[bytes, bytes]:
    with pa.OSFile(str(path)) as source:
        try:
            return dict(pa.ipc.open_stream(source).schema.metadata or {})
        except _TORN:
            return {}


def list_segments(shard_dir: Path) -> list[tuple[int, bool, Path]]:
    """``(number, is_compaction, path)`` of every segment, by number."""
    found = []
    for path in shard_dir.iterdir():
        match = _SEGMENT_NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), match.group(2) is not None, path))
    return sorted(found)


def live_segments(shard_dir: Path) -> list[Path]:
    """The segments that make up the log: from the last compaction on."""
    segments = list_segments(shard_dir)
    start = max((i for i, (_, compact, _) in enumerate(segments) if compact), default=0)
    return [path for _, _, path in segments[start:]]


def _mean_reward(group: LoggedGroup) -> float | None:
    rewards = group.rewards
    return sum(rewards) / len(rewards) if rewards else None
