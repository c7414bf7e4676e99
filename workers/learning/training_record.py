"""The training record: for every learner step, exactly what it trained (docs/design.md §9b).

Each learner rank appends one Arrow IPC record batch per step to
``<run_dir>/record/rank<R>.epoch<E>.arrow`` (one file per rank and learner epoch, written once,
flushed after every step): the step's groups in the order they were trained (msgpack, scores
included: a replay never re-queries a reward role), the epoch and staleness bound in force, the
torch RNG state the step started from (LoRA dropout draws from it) and an xxh3-64 digest of the
rank's trained weights after the step (its fp32 masters, every byte). The file's schema metadata
says how to rebuild the learner: model and adapter directories, rank, world size, threads and
compute dtype. ``streamrl replay`` (``replay``) reads it back and retrains.

A run's timeline follows its epochs (``streamrl.clock``): a resumed epoch retrains the steps after
the checkpoint it resumed at, so its rows replace the earlier epoch's from its first step on.

Invariant: a step's row is written after its update and before its version is published, so a
version any generator ever sampled with has its row (a crash mid-write leaves a truncated file:
``read_record`` keeps every whole step before it and says where the record ends).

Example: steps 1-5 of epoch 0, a crash, a resume at checkpoint 3 writing steps 4-6 in epoch 1 ->
the timeline is epoch 0's steps 1-3 and epoch 1's steps 4-6.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import torch
import xxhash

from streamrl.protocol import TrajectoryGroup

FORMAT = 1
RECORD_DIR = "record"
_FILE_NAME = re.compile(r"rank(?P<rank>\d+)\.epoch(?P<epoch>\d+)\.arrow")

SCHEMA = pa.schema(
    [
        ("step", pa.int64()),  # the version this step made
        ("epoch", pa.int32()),
        ("group_ids", pa.list_(pa.string())),
        ("groups", pa.binary()),  # msgpack list[TrajectoryGroup], in trained order
        ("rng_state", pa.binary()),  # torch.get_rng_state() before the step
        ("digest", pa.uint64()),  # weights_digest after the step
        ("max_staleness", pa.int32()),
        ("time", pa.float64()),
    ]
)


def weights_digest(modules: list[torch.nn.Module]) -> int:
    """xxh3-64 over every trained parameter's local shard, in ``named_parameters`` order: equal
    digests mean bitwise equal weights (the fp32 masters, not their bf16 image)."""
    digest = xxhash.xxh3_64()
    for module in modules:
        for _, param in module.named_parameters():
            if not param.requires_grad:
                continue
            local = param.to_local() if hasattr(param, "to_local") else param
            local = local.detach().contiguous().cpu()
            digest.update(local.view(torch.uint8).reshape(-1).numpy())
    return digest.intdigest()


def record_path(run_dir: Path, rank: int, epoch: int) -> Path:
    return run_dir / RECORD_DIR / f"rank{rank}.epoch{epoch}.arrow"


class TrainingRecord:
    """One rank's writer for one learner epoch."""

    def __init__(self, run_dir: Path, rank: int, epoch: int, header: dict[str, Any]) -> None:
        path = record_path(run_dir, rank, epoch)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"streamrl_record": json.dumps({"format": FORMAT, **header})}
        self.path, self.epoch = path, epoch
        self.sink = pa.OSFile(str(path), "wb")
        self.writer = pa.ipc.new_stream(self.sink, SCHEMA.with_metadata(meta))
        self.encoder = msgspec.msgpack.Encoder()
        self.bytes_written = 0

    def record_step(
        self,
        step: int,
        groups: list[TrajectoryGroup],
        rng_state: torch.Tensor,
        trained: list[torch.nn.Module],
        max_staleness: int,
    ) -> dict[str, float]:
        """Digest ``trained`` (the weights step ``step`` made) and append the step's row; returns
        the learner's metrics of it (bytes on disk, seconds taken)."""
        start = time.perf_counter()
        digest = weights_digest(trained)
        size = self.write(step, groups, rng_state, digest, max_staleness, time.time())
        return {"record/bytes": float(size), "record/s": time.perf_counter() - start}

    def write(
        self,
        step: int,
        groups: list[TrajectoryGroup],
        rng_state: torch.Tensor,
        digest: int,
        max_staleness: int,
        at: float,
    ) -> int:
        """Append step ``step``'s row and flush it; returns the bytes it took on disk."""
        before = self.sink.tell()
        row = {
            "step": [step],
            "epoch": [self.epoch],
            "group_ids": [[g.group_id for g in groups]],
            "groups": [self.encoder.encode(groups)],
            "rng_state": [rng_state.numpy().tobytes()],
            "digest": [digest],
            "max_staleness": [max_staleness],
            "time": [at],
        }
        self.writer.write_batch(pa.RecordBatch.from_pydict(row, schema=SCHEMA))
        self.sink.flush()
        taken = self.sink.tell() - before
        self.bytes_written += taken
        return taken

    def close(self) -> None:
        self.writer.close()
        self.sink.close()


class NoRecord:
    """A run without a training record (``run.training_record: false``)."""

    def record_step(self, *_args: object) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- reading


@dataclass
class RecordedStep:
    step: int
    epoch: int
    groups: list[TrajectoryGroup]
    rng_state: torch.Tensor
    digest: int
    max_staleness: int


@dataclass
class RecordedRun:
    """A run's record: ``header`` (rank 0's first file's), per rank the timeline of steps, and
    ``problems``: one line for each file that ended early or could not be read."""

    header: dict[str, Any]
    ranks: list[list[RecordedStep]]
    problems: list[str] = field(default_factory=list)

    @property
    def steps(self) -> list[int]:
        """The steps every rank has, in order (a replay can go as far as the shortest rank)."""
        if not self.ranks:
            return []
        count = min(len(r) for r in self.ranks)
        return [s.step for s in self.ranks[0][:count]]


class RecordError(ValueError):
    """No record to replay; the message is one line."""


def _read_file(path: Path, problems: list[str]) -> tuple[dict[str, Any], list[RecordedStep]]:
    decoder = msgspec.msgpack.Decoder(list[TrajectoryGroup])
    steps: list[RecordedStep] = []
    try:
        reader = pa.ipc.open_stream(pa.memory_map(str(path)))
    except (pa.ArrowInvalid, OSError) as exc:
        problems.append(f"{path.name}: unreadable ({exc}); nothing of it is replayed")
        return {}, steps
    header = json.loads(reader.schema.metadata[b"streamrl_record"])
    try:
        for batch in reader:
            for row in batch.to_pylist():
                steps.append(
                    RecordedStep(
                        row["step"],
                        row["epoch"],
                        decoder.decode(row["groups"]),
                        torch.frombuffer(bytearray(row["rng_state"]), dtype=torch.uint8),
                        row["digest"],
                        row["max_staleness"],
                    )
                )
    except (pa.ArrowInvalid, OSError, msgspec.DecodeError) as exc:
        last = steps[-1].step if steps else "none"
        problems.append(f"{path.name}: truncated after step {last} ({exc})")
    return header, steps


def read_record(run_dir: Path) -> RecordedRun:
    """Every rank's timeline of recorded steps (see the module doc for how epochs join)."""
    record_dir = run_dir / RECORD_DIR
    files = sorted(record_dir.glob("rank*.epoch*.arrow")) if record_dir.is_dir() else []
    if not files:
        raise RecordError(
            f"{run_dir}: no training record (record/ is missing; was run.training_record off?)"
        )
    by_rank: dict[int, list[tuple[int, Path]]] = {}
    for path in files:
        named = _FILE_NAME.fullmatch(path.name)
        if named is None:
            continue
        rank, epoch = int(named["rank"]), int(named["epoch"])
        by_rank.setdefault(rank, []).append((epoch, path))
    problems: list[str] = []
    header: dict[str, Any] = {}
    ranks: list[list[RecordedStep]] = []
    world = None
    for rank in range(max(by_rank) + 1):
        timeline: list[RecordedStep] = []
        for _epoch, path in sorted(by_rank.get(rank, [])):
            file_header, steps = _read_file(path, problems)
            if rank == 0 and not header and file_header:
                header = file_header
            world = world or file_header.get("world_size")
            if steps:  # a resumed epoch replaces the timeline from its first step on
                timeline = [s for s in timeline if s.step < steps[0].step] + steps
        if not by_rank.get(rank):
            problems.append(f"rank {rank}: no record file")
        ranks.append(timeline)
    if not header:
        raise RecordError(f"{record_dir}: no readable record of rank 0")
    if world is not None and len(ranks) != world:
        problems.append(f"the record holds {len(ranks)} of the run's {world} ranks")
    for rank, timeline in enumerate(ranks):
        first = timeline[0].step if timeline else 1
        gap = next((i for i, s in enumerate(timeline) if s.step != first + i), None)
        if gap is not None:
            problems.append(f"rank {rank}: no record of step {first + gap}; replayed up to it")
            del timeline[gap:]
    return RecordedRun(header, ranks, problems)
