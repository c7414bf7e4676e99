"""The training record's file format: steps read back whole, epochs join into one timeline, and
a record that ends early or lacks a rank says so in one line and keeps what it has."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support import make_group

from streamrl.workers.learning.training_record import (
    RecordError,
    TrainingRecord,
    read_record,
    record_path,
    weights_digest,
)

HEADER = {"world_size": 1, "threads": 1, "compute_dtype": "float32", "model_dir": "m"}


def _write(run_dir: Path, rank: int, epoch: int, steps: range, world: int = 1) -> None:
    record = TrainingRecord(run_dir, rank, epoch, {**HEADER, "world_size": world, "rank": rank})
    for step in steps:
        groups = [make_group(f"e{epoch}s{step}g{i}", version=step - 1) for i in range(2)]
        record.write(step, groups, torch.get_rng_state(), 1000 * epoch + step, 1, 0.0)
    record.close()


def test_steps_read_back_whole(tmp_path: Path) -> None:
    _write(tmp_path, 0, 0, range(1, 4))
    run = read_record(tmp_path)
    assert run.problems == [] and run.steps == [1, 2, 3]
    step = run.ranks[0][1]
    assert [g.group_id for g in step.groups] == ["e0s2g0", "e0s2g1"]
    assert step.groups[0].trajectories[0].reward == 0.0 and step.digest == 2
    assert torch.equal(step.rng_state, torch.get_rng_state())
    assert run.header["compute_dtype"] == "float32"


def test_a_resumed_epoch_replaces_the_steps_after_its_fork(tmp_path: Path) -> None:
    _write(tmp_path, 0, 0, range(1, 6))  # steps 4 and 5 were lost with the crash
    _write(tmp_path, 0, 1, range(4, 8))  # resumed at checkpoint 3
    run = read_record(tmp_path)
    assert run.steps == [1, 2, 3, 4, 5, 6, 7]
    assert [s.epoch for s in run.ranks[0]] == [0, 0, 0, 1, 1, 1, 1]


def test_a_truncated_record_keeps_its_whole_steps(tmp_path: Path) -> None:
    _write(tmp_path, 0, 0, range(1, 5))
    path = record_path(tmp_path, 0, 0)
    path.write_bytes(path.read_bytes()[:-200])  # a crash in the middle of step 4's row
    run = read_record(tmp_path)
    assert run.steps == [1, 2, 3]
    assert len(run.problems) == 1 and "truncated after step 3" in run.problems[0]


def test_a_missing_rank_or_record_is_named(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match="no training record"):
        read_record(tmp_path)
    _write(tmp_path, 0, 0, range(1, 3), world=2)
    run = read_record(tmp_path)
    assert run.problems == ["the record holds 1 of the run's 2 ranks"]


def test_a_gap_ends_the_timeline(tmp_path: Path) -> None:
    _write(tmp_path, 0, 0, range(1, 3))
    _write(tmp_path, 0, 1, range(5, 7))  # steps 3 and 4 are nowhere
    run = read_record(tmp_path)
    assert run.steps == [1, 2] and any("no record of step 3" in p for p in run.problems)


def test_the_digest_sees_every_bit_of_the_trained_weights() -> None:
    model = torch.nn.Linear(4, 3)
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    before = weights_digest([model, frozen])
    with torch.no_grad():
        frozen.weight.add_(1.0)
    assert weights_digest([model, frozen]) == before  # frozen weights do not train
    with torch.no_grad():
        bits = model.weight.view(torch.int32)
        bits[1, 2] ^= 1  # one mantissa bit
    assert weights_digest([model, frozen]) != before
