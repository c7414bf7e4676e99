"""DurableLog: exact round trips, torn tails, compaction, and the Parquet export."""

from __future__ import annotations

import logging
import math
import os
import struct
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamrl.buffers.durable_log import DurableLog
from streamrl.buffers.export import export_parquet
from streamrl.buffers.log_history import scan_shard
from streamrl.protocol import Trajectory, TrajectoryGroup, pack_int32

# Awkward float32 logprobs (subnormal, negative zero, the largest finite, inf, NaN): the raw
# bytes must round-trip bit for bit.
AWKWARD_LOGPROBS = [-0.1, -(2.0**-149), -math.pi, -0.0, -3.4028234663852886e38, -math.inf, math.nan]


def awkward_group(i: int, n: int = 2, version: int = 0) -> TrajectoryGroup:
    trajectories = [
        Trajectory.from_lists(
            prompt_ids=[i, j, 7],
            response_ids=[100 + j, 2**31 - 1, 0, 5, -(2**31), 9, 1],
            behavior_logprobs=[x * (i + 1) for x in AWKWARD_LOGPROBS],
            token_versions=[version] * 2 + [version + 1] * 3 + [version + 2] * 2,
            reward=float(j) - 0.25,
            finish_reason="length" if j else "stop",
            generator_id=j,
            response_text=f"answer {i}/{j} ✓",
        )
        for j in range(n)
    ]
    return TrajectoryGroup(
        group_id=f"g{i}",
        prompt_id=f"p{i}",
        trajectories=trajectories,
        created_at=1000.0 + i,
        finished_at=1000.5 + i,
        data_source="arithmetic",
        ground_truth=str(i),
    )


def decode(payload: bytes) -> TrajectoryGroup:
    return msgspec.msgpack.decode(payload, type=TrajectoryGroup)


def bits(values: list[float]) -> bytes:
    """float32 images, as the wire carries them."""
    return struct.pack(f"<{len(values)}f", *values)


def segments(shard_dir: Path) -> list[Path]:
    return sorted(shard_dir.glob("*.arrows"))


def test_append_consume_recover_round_trip_is_exact(tmp_path):
    groups = [awkward_group(i) for i in range(6)]
    with DurableLog(tmp_path, 0) as log:
        log.append(groups[0])
        log.append_many(groups[1:4])
        log.mark_consumed(["g1", "g3"])
        log.append_many(groups[4:])
        log.mark_consumed(["g4", "not-logged"])
        assert [g.group_id for g in log.recover()] == ["g0", "g2", "g5"]  # while open
    with DurableLog(tmp_path, 0) as log:
        recovered = log.recover()
    assert recovered == [groups[0], groups[2], groups[5]]  # the raw arrays, byte for byte


def test_queryable_columns_match_the_payload(tmp_path):
    spans = awkward_group(0, n=3, version=2)
    spans.trajectories[1].token_versions = pack_int32([9, 1, 4, 4, 4, 4, 4])
    empty = awkward_group(1, n=1)
    empty.trajectories[0].response_ids = b""
    empty.trajectories[0].behavior_logprobs = b""
    empty.trajectories[0].token_versions = b""
    with DurableLog(tmp_path, 0) as log:
        log.append_many([spans, empty])
    (segment,) = segments(tmp_path / "shard-0")
    with pa.ipc.open_stream(pa.OSFile(str(segment))) as reader:
        table = reader.read_all()
    assert table.column("min_version").to_pylist() == [1, 0]
    assert table.column("max_version").to_pylist() == [9, 0]
    assert table.column("num_tokens").to_pylist() == [spans.num_tokens, empty.num_tokens]
    assert table.column("mean_reward").to_pylist() == [0.75, -0.25]
    assert (spans.min_version, spans.max_version) == (1, 9)


def test_each_process_start_writes_a_new_segment_and_recovery_reads_all(tmp_path):
    with DurableLog(tmp_path, 3) as log:
        log.append_many([awkward_group(0), awkward_group(1)])
    with DurableLog(tmp_path, 3) as log:
        log.mark_consumed(["g0"])
        log.append(awkward_group(2))
    with DurableLog(tmp_path, 3) as log:
        assert [g.group_id for g in log.recover()] == ["g1", "g2"]
        assert [g.group_id for g in log.iter_all()] == ["g0", "g1", "g2"]
    assert [p.name for p in segments(tmp_path / "shard-3")] == [
        "00000001.arrows",
        "00000002.arrows",
    ]


def test_a_group_logged_twice_is_recovered_once(tmp_path):
    with DurableLog(tmp_path, 0) as log:
        log.append(awkward_group(0))
        log.append(awkward_group(0))
        assert len(log.recover()) == 1
        log.mark_consumed(["g0"])
        assert log.recover() == []


def test_second_writer_on_the_same_shard_is_refused(tmp_path):
    with DurableLog(tmp_path, 0):
        with pytest.raises(RuntimeError, match="already open"):
            DurableLog(tmp_path, 0)
    DurableLog(tmp_path, 0).close()  # free again once closed


def test_recover_ignores_a_torn_tail(tmp_path):
    with DurableLog(tmp_path, 0) as log:
        log.append_many([awkward_group(0), awkward_group(1)])
        log.append_many([awkward_group(2)])
        log.mark_consumed(["g1"])
        log.append_many([awkward_group(3), awkward_group(4)])
    (segment,) = segments(tmp_path / "shard-0")
    # The writer's end-of-stream marker is 8 bytes; cutting 40 lands inside the last batch,
    # as if the process had been killed mid-write.
    os.truncate(segment, segment.stat().st_size - 40)
    with DurableLog(tmp_path, 0) as log:
        assert [g.group_id for g in log.recover()] == ["g0", "g2"]
        log.append(awkward_group(5))  # the next process carries on in a new segment
    with DurableLog(tmp_path, 0) as log:
        assert [g.group_id for g in log.recover()] == ["g0", "g2", "g5"]


def test_every_truncation_point_recovers_a_state_that_was_acknowledged(tmp_path):
    states: list[list[str]] = [[]]  # what recover() must return after each write returned
    with DurableLog(tmp_path / "log", 0) as log:
        log.append_many([awkward_group(0), awkward_group(1)])
        states.append(["g0", "g1"])
        log.mark_consumed(["g0"])
        states.append(["g1"])
        log.append(awkward_group(2))
        states.append(["g1", "g2"])
    (segment,) = segments(tmp_path / "log" / "shard-0")
    data = segment.read_bytes()
    shard = tmp_path / "cut" / "shard-0"
    shard.mkdir(parents=True)
    seen = set()
    for cut in range(0, len(data) + 1, 5):
        (shard / segment.name).write_bytes(data[:cut])
        got = [g.group_id for g, consumed in scan_shard(shard) if not consumed]
        assert got in states, f"cut at {cut} of {len(data)} bytes gave {got}"
        seen.add(tuple(got))
    assert len(seen) == len(states)


def test_a_failed_write_does_not_hide_later_appends(tmp_path, monkeypatch):
    """A write that fails half-way (disk full) leaves a torn batch mid-segment; the log must
    move to a new segment so that what it appends afterwards stays readable."""
    log = DurableLog(tmp_path, 0)
    log.append(awkward_group(0))
    real = log._file
    real_write = real.write

    def half_then_fail(data):
        real_write(bytes(memoryview(data))[: len(data) // 2])
        raise OSError("No space left on device")

    monkeypatch.setattr(real, "write", half_then_fail, raising=False)
    with pytest.raises(OSError, match="No space"):
        log.append(awkward_group(1))
    log.append(awkward_group(2))
    log.close()
    assert len(segments(tmp_path / "shard-0")) == 2
    with DurableLog(tmp_path, 0) as log:
        assert [g.group_id for g in log.recover()] == ["g0", "g2"]


def test_recover_tolerates_a_segment_torn_inside_its_schema(tmp_path):
    with DurableLog(tmp_path, 0) as log:
        log.append(awkward_group(0))
    with DurableLog(tmp_path, 0) as log:
        log.append(awkward_group(1))
    second = segments(tmp_path / "shard-0")[1]
    os.truncate(second, 20)
    with DurableLog(tmp_path, 0) as log:
        assert [g.group_id for g in log.recover()] == ["g0"]


def test_compaction_keeps_exactly_the_unconsumed(tmp_path):
    groups = [awkward_group(i) for i in range(8)]
    with DurableLog(tmp_path, 0) as log:
        log.append_many(groups[:5])
        log.mark_consumed(["g0", "g2", "g4"])
    with DurableLog(tmp_path, 0) as log:
        log.append_many(groups[5:])
        log.mark_consumed(["g6"])
        log.compact()
        names = [p.name for p in segments(tmp_path / "shard-0")]
        assert names == ["00000003.compact.arrows"]
        assert log.recover() == [groups[1], groups[3], groups[5], groups[7]]
        assert [g.group_id for g in log.iter_all()] == ["g1", "g3", "g5", "g7"]
        log.mark_consumed(["g3"])  # goes to a new segment after the compacted one
        log.append(awkward_group(8))
    with DurableLog(tmp_path, 0) as log:
        assert [g.group_id for g in log.recover()] == ["g1", "g5", "g7", "g8"]
        log.compact()
        log.compact()  # idempotent
        assert [g.group_id for g in log.recover()] == ["g1", "g5", "g7", "g8"]
        log.mark_consumed(["g1", "g5", "g7", "g8"])
        log.compact()
        assert log.recover() == []


def test_a_compacted_segment_supersedes_leftovers_of_a_crashed_compaction(tmp_path):
    with DurableLog(tmp_path, 0) as log:
        log.append_many([awkward_group(0), awkward_group(1)])
        log.mark_consumed(["g0"])
    shard = tmp_path / "shard-0"
    old = (shard / "00000001.arrows").read_bytes()
    with DurableLog(tmp_path, 0) as log:
        log.compact()
    # Simulate a crash after the rename but before the old segment was deleted.
    (shard / "00000001.arrows").write_bytes(old)
    (shard / "00000009.compact.tmp").write_bytes(b"half-written")
    with DurableLog(tmp_path, 0) as log:
        assert [g.group_id for g in log.recover()] == ["g1"]
    assert sorted(p.name for p in shard.iterdir()) == ["00000002.compact.arrows", "LOCK"]


def test_fsync_mode_round_trips(tmp_path):
    with DurableLog(tmp_path, 1, fsync=True) as log:
        log.append_many([awkward_group(0), awkward_group(1)])
        log.mark_consumed(["g1"])
    with DurableLog(tmp_path, 1) as log:
        assert [g.group_id for g in log.recover()] == ["g0"]


def test_export_writes_one_row_per_trajectory(tmp_path):
    run_dir = tmp_path / "run"
    with DurableLog(run_dir / "buffer", 0) as log:
        g1 = awkward_group(1, n=3, version=4)
        g1.trajectories[0].guided = True  # a reference in place of a sample (guidance)
        log.append_many([awkward_group(0, n=2), g1])
        log.mark_consumed(["g0"])
    episode = awkward_group(2, n=1)
    t = episode.trajectories[0]
    t.action_mask = bytes([1] * (t.num_response_tokens - 1) + [0])  # a multi-turn episode's
    t.turns, t.end_reason = 2, "malformed tool call: no </calc>"
    with DurableLog(run_dir / "buffer", 1) as log:
        log.append(episode)
    out = tmp_path / "export" / "trajectories.parquet"
    assert export_parquet(run_dir, out) == 6
    table = pq.read_table(out)
    assert table.num_rows == 6
    rows = table.to_pylist()
    assert [r["group_id"] for r in rows] == ["g0", "g0", "g1", "g1", "g1", "g2"]
    assert [r["consumed"] for r in rows] == [True, True, False, False, False, False]
    want = awkward_group(1, n=3, version=4).trajectories[2]
    row = rows[4]
    assert row["prompt_id"] == "p1" and row["data_source"] == "arithmetic"
    assert row["ground_truth"] == "1"
    assert row["prompt_ids"] == want.prompt_list()
    assert row["response_ids"] == want.response_list()
    assert bits(row["behavior_logprobs"]) == want.behavior_logprobs
    assert row["token_versions"] == want.version_list()
    assert (row["min_version"], row["max_version"]) == (4, 6)
    assert table.schema.field("behavior_logprobs").type == pa.list_(pa.float32())
    assert row["reward"] == want.reward and row["finish_reason"] == "length"
    assert row["generator_id"] == 2 and row["response_text"] == want.response_text
    # A single-turn trajectory: every token the policy's; the episode's mask as it was logged.
    assert row["action_mask"] == [1] * len(want.response_list()) and row["turns"] == 0
    assert rows[5]["action_mask"] == list(t.action_mask) and rows[5]["turns"] == 2
    assert rows[5]["end_reason"] == "malformed tool call: no </calc>"
    assert [r["guided"] for r in rows] == [False, False, True, False, False, False]


def test_a_payload_that_does_not_decode_is_skipped_counted_and_logged_once(tmp_path, caplog):
    with DurableLog(tmp_path, 0) as log:
        log.append(awkward_group(0))
        log.append_many([awkward_group(1), awkward_group(2)], [b"\xc1", b"\x93garbage"])
        log.append(awkward_group(3))
    with caplog.at_level(logging.WARNING), DurableLog(tmp_path, 0) as log:
        assert [g.group_id for g in log.recover()] == ["g0", "g3"]
        assert log.undecodable == 2
        assert len(log.recover_payloads()) == 4  # not decoded: whoever decodes them counts
    warnings = [r.getMessage() for r in caplog.records if "do not decode" in r.getMessage()]
    assert len(warnings) == 1 and "skipped 2 logged groups" in warnings[0]


def test_export_without_a_log_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        export_parquet(tmp_path / "nowhere", tmp_path / "out.parquet")
    (tmp_path / "run" / "buffer" / "shard-0").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no buffer log segments"):
        export_parquet(tmp_path / "run", tmp_path / "out.parquet")


def test_tallies_survive_reopen_and_compaction(tmp_path):
    """received == sum(removed) + remaining from the log alone, across processes (reopen)
    and compactions, with drops counted by reason and refusals on arrival counted too."""
    with DurableLog(tmp_path, 0) as log:
        log.append_many([awkward_group(i) for i in range(6)])
        log.mark_consumed(["g0", "g1"])
        log.mark_consumed(["g2"], ["stale"])
        log.refuse(["g9", "g0"], ["stale", "duplicate"])  # never stored
        assert log.tallies.received == 8
        assert log.tallies.removed == {"consumed": 2, "stale": 2, "duplicate": 1}
        assert log.tallies.remaining == 3
        log.compact()
    with DurableLog(tmp_path, 0) as log:  # a restarted shard reads the same figures
        t = log.tallies
        assert (t.received, t.removed, t.remaining) == (
            8,
            {"consumed": 2, "stale": 2, "duplicate": 1},
            3,
        )
        log.append(awkward_group(7))
        log.mark_consumed(["g3"])
    with DurableLog(tmp_path, 0) as log:
        t = log.tallies
        assert t.received == 9 and t.removed["consumed"] == 3 and t.remaining == 3
        assert t.received == sum(t.removed.values()) + t.remaining
        assert sorted(g.group_id for g in log.recover()) == ["g4", "g5", "g7"]


def test_each_clients_last_take_survives_reopen_and_compactions(tmp_path):
    """A restarted shard must answer a repeat of a client's last take with the same groups:
    the take rows and its groups' payloads outlive reopening and compaction, and the tallies
    stay exact while compaction keeps consumed groups for that purpose."""
    groups = [awkward_group(i) for i in range(8)]
    with DurableLog(tmp_path, 0) as log:
        log.append_many(groups)
        log.record_take("a", 1, ["g0", "g1"])
        log.mark_consumed(["g0", "g1"])
        log.record_take("a", 2, ["g2"])  # a's newer take replaces its first
        log.mark_consumed(["g2"])
        log.record_take("b", 1, ["g3", "g4"])  # taken, g4 still stored (reused)
        log.mark_consumed(["g3"])
        log.mark_consumed(["g5"], ["stale"])

    def check(log: DurableLog) -> None:
        takes = log.recover_takes()
        assert [(c, t.request_id) for c, t in takes.items()] == [("a", 2), ("b", 1)]
        decoded = {c: [decode(p).group_id for p in t.items] for c, t in takes.items()}
        assert decoded == {"a": ["g2"], "b": ["g3", "g4"]}
        assert takes.answer("b", 1)[1] == msgspec.msgpack.encode(groups[4])  # bit-exact
        t = log.tallies
        assert (t.received, t.removed, t.remaining) == (8, {"consumed": 4, "stale": 1}, 3)
        assert sorted(g.group_id for g in log.recover()) == ["g4", "g6", "g7"]

    with DurableLog(tmp_path, 0) as log:
        check(log)
        log.compact()
    with DurableLog(tmp_path, 0) as log:
        check(log)
        # Compacting a compaction keeps the same, and later takes land after it.
        log.compact()
        log.record_take("a", 3, ["g6"])
        log.mark_consumed(["g6"])
    with DurableLog(tmp_path, 0) as log:
        assert log.recover_takes().answer("a", 3) is not None
        assert log.recover_takes().answer("a", 2) == []  # older than a's last take
        t = log.tallies
        assert (t.received, t.removed["consumed"], t.remaining) == (8, 5, 2)
        log.compact()
        # Only the last takes' groups are kept as consumed rows: g3 (b's) and g6 (a's).
        kept = [(g.group_id, consumed) for g, consumed in scan_shard(log.shard_dir)]
        assert kept == [("g3", True), ("g4", False), ("g6", True), ("g7", False)]
