"""Export a run's buffer log as one flat Parquet table, one row per trajectory.

The durable log stores each group as a msgpack payload (fast to append); this is the offline
step that flattens it for analysis or for training on the collected data elsewhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from streamrl.files import atomic_writer

from .log_history import scan_shard, shard_dirs

EXPORT_SCHEMA = pa.schema(
    [
        ("group_id", pa.string()),
        ("prompt_id", pa.string()),
        ("data_source", pa.string()),
        ("ground_truth", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("response_text", pa.string()),
        ("reward", pa.float64()),
        ("behavior_logprobs", pa.list_(pa.float32())),  # the dtype they travel in
        ("token_versions", pa.list_(pa.int32())),
        # The trajectory's own versions (its group's min_version is the min over the group).
        ("min_version", pa.int64()),
        ("max_version", pa.int64()),
        ("finish_reason", pa.string()),
        ("generator_id", pa.int32()),
        ("consumed", pa.bool_()),
        # Multi-turn episodes: 1 per policy token, 0 per environment token (all 1 for a
        # single-turn trajectory), the policy turns (0: single-turn) and an abnormal end's reason.
        ("action_mask", pa.list_(pa.uint8())),
        ("turns", pa.int32()),
        ("end_reason", pa.string()),
        # A reference response in place of a sample (``algorithm.guidance``): not sampled, its
        # behaviour logprobs are zeros.
        ("guided", pa.bool_()),
    ]
)
# Columns built from a trajectory's raw little-endian arrays, and their numpy dtypes.
ARRAY_COLUMNS = {
    "prompt_ids": np.dtype("<i4"),
    "response_ids": np.dtype("<i4"),
    "behavior_logprobs": np.dtype("<f4"),
    "token_versions": np.dtype("<i4"),
    "action_mask": np.dtype("u1"),
}
_ROWS_PER_BATCH = 4096


def export_parquet(run_dir: Path, out: Path) -> int:
    """Write every trajectory logged under ``run_dir/buffer/`` (all shards, shard by shard,
    each in append order) to the Parquet file ``out``; return the number of rows written.

    ``consumed`` says whether the group had left the shard when the log was read. Groups
    removed by a compaction are gone from the log and so from the export. A logged group
    whose payload does not decode, or whose arrays are inconsistent, is left out.
    """
    buffer_dir = Path(run_dir) / "buffer"
    if not buffer_dir.is_dir():
        raise FileNotFoundError(f"no buffer log: {buffer_dir} does not exist")
    shards = shard_dirs(buffer_dir)
    if not shards:
        raise FileNotFoundError(f"no buffer log segments under {buffer_dir}")

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = 0
    columns: dict[str, list[Any]] = {name: [] for name in EXPORT_SCHEMA.names}
    with atomic_writer(out) as f, pq.ParquetWriter(f, EXPORT_SCHEMA) as writer:
        for shard_dir in shards:
            for group, consumed in scan_shard(shard_dir):
                if group.check() is not None:
                    continue
                for t in group.trajectories:
                    lo, hi = t.version_range()
                    row = (
                        group.group_id, group.prompt_id, group.data_source, group.ground_truth,
                        t.prompt_ids, t.response_ids, t.response_text, t.reward,
                        t.behavior_logprobs, t.token_versions, lo, hi,
                        t.finish_reason, t.generator_id, consumed,
                        t.policy_mask(), t.turns, t.end_reason, t.guided,
                    )  # fmt: skip
                    for column, value in zip(columns.values(), row, strict=True):
                        column.append(value)
                    rows += 1
                if len(columns["group_id"]) >= _ROWS_PER_BATCH:
                    _flush(writer, columns)
        _flush(writer, columns)
    return rows


def list_array(chunks: list[bytes], dtype: np.dtype) -> pa.ListArray:
    """One list per raw array: the bytes joined once and viewed as ``dtype`` (no per-element
    Python work), with offsets from the chunk lengths."""
    values = np.frombuffer(b"".join(chunks), dtype=dtype).astype(
        dtype.newbyteorder("="), copy=False
    )
    lengths = np.fromiter((len(c) for c in chunks), dtype=np.int32, count=len(chunks))
    offsets = np.zeros(len(chunks) + 1, dtype=np.int32)
    np.cumsum(lengths // dtype.itemsize, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def _flush(writer: pq.ParquetWriter, columns: dict[str, list[Any]]) -> None:
    if not columns["group_id"]:
        return
    arrays = [
        list_array(values, ARRAY_COLUMNS[field.name])
        if field.name in ARRAY_COLUMNS
        else pa.array(values, field.type)
        for field, values in zip(EXPORT_SCHEMA, columns.values(), strict=True)
    ]
    writer.write_table(pa.Table.from_arrays(arrays, schema=EXPORT_SCHEMA))
    for column in columns.values():
        column.clear()
