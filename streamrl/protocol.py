"""Wire types shared by every role (DESIGN.md §5).

All messages are ``msgspec.Struct``s encoded with msgpack. Arrays travel as raw bytes plus
dtype and shape, never as Python lists. New fields are appended at the end with defaults so
that old peers keep decoding. Control messages are tagged unions handled with ``match``.

This module is a leaf: stdlib and msgspec only (no torch, no numpy, no zmq).
"""

from __future__ import annotations

from typing import Literal

import msgspec


class Array(msgspec.Struct, frozen=True):
    """A dense array as raw little-endian bytes. ``dtype`` uses torch names (``bfloat16``)."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes


# --------------------------------------------------------------------------- trajectories


class Trajectory(msgspec.Struct):
    """One sampled response to one prompt.

    ``behavior_logprobs[i]`` is the log-probability of ``response_ids[i]`` under the distribution
    the generator actually sampled from; ``token_versions[i]`` is the weight version that
    produced that token (in-flight updates make one trajectory span versions).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    behavior_logprobs: list[float]
    token_versions: list[int]
    reward: float
    finish_reason: Literal["stop", "length", "abort"]
    generator_id: int
    response_text: str = ""
    # Sampling temperature of this response; the learner scores it at the same temperature.
    temperature: float = 1.0

    @property
    def min_version(self) -> int:
        return min(self.token_versions) if self.token_versions else 0

    @property
    def max_version(self) -> int:
        return max(self.token_versions) if self.token_versions else 0


class TrajectoryGroup(msgspec.Struct):
    """All samples of one prompt; GRPO needs the group whole, so it is never split."""

    group_id: str
    prompt_id: str
    trajectories: list[Trajectory]
    created_at: float
    finished_at: float
    data_source: str = ""
    ground_truth: str = ""

    @property
    def min_version(self) -> int:
        return min((t.min_version for t in self.trajectories), default=0)

    @property
    def max_version(self) -> int:
        return max((t.max_version for t in self.trajectories), default=0)

    @property
    def num_tokens(self) -> int:
        return sum(len(t.prompt_ids) + len(t.response_ids) for t in self.trajectories)


# --------------------------------------------------------------------------- buffer <-> learner


class BatchRequest(msgspec.Struct, tag="batch_request"):
    """A learner rank asks one shard for up to ``k`` groups with ``min_version >= floor``.

    ``wait_ms`` makes it a long poll: the shard answers as soon as ``k`` eligible groups exist
    or when the wait runs out, with whatever it has (possibly none).
    """

    request_id: int
    k: int
    floor: int
    learner_version: int
    wait_ms: int = 0


class Batch(msgspec.Struct, tag="batch"):
    request_id: int
    groups: list[TrajectoryGroup]


class StatsRequest(msgspec.Struct, tag="stats_request"):
    pass


class ShardStats(msgspec.Struct, tag="shard_stats"):
    shard_id: int
    size: int
    capacity: int
    ingested: int
    consumed: int
    dropped: dict[str, int]
    bytes: int
    malformed: int = 0
    staleness_hist: dict[int, int] = {}
    # Malformed frames by kind (e.g. ``DecodeError``, ``ValidationError``, ``frames``).
    malformed_by_kind: dict[str, int] = {}
    # Peers that dropped their connection; libzmq also drops a peer that sends a frame over
    # ``max_message_bytes``, so oversized frames show up here (libzmq gives no reason).
    disconnects: int = 0
    # Groups recovered from the durable log when this shard process started.
    recovered: int = 0
    # overflow=block: groups received while full, waiting for space (not yet accepted).
    held: int = 0


class Reconfigure(msgspec.Struct, tag="reconfigure"):
    """Live-tunable buffer knobs; ``None`` leaves a knob unchanged."""

    capacity: int | None = None
    max_staleness: int | None = None
    sampling: str | None = None
    max_reuse: int | None = None
    overflow: str | None = None


class Ack(msgspec.Struct, tag="ack"):
    ok: bool
    error: str = ""


class Peek(msgspec.Struct, tag="peek"):
    """Ask a shard, without taking anything, which groups it would hand out next.

    The shard answers with a ``PeekReply`` at once if it holds at least one group with
    ``min_version >= floor``, else when one arrives or ``wait_ms`` runs out (long poll).
    """

    request_id: int
    k: int
    floor: int
    learner_version: int
    wait_ms: int = 0


class PeekReply(msgspec.Struct, tag="peek_reply"):
    """``order[i]`` is the sort key of the ``i``-th group the shard would hand out next (at
    most ``k``): ``(0, finished_at)`` for fifo and random sampling, ``(-min_version,
    finished_at)`` for freshest. Smaller keys go first when a client merges shards.
    ``size`` is every group the shard holds, eligible or not."""

    request_id: int
    order: list[tuple[int, float]]
    size: int


class Checkpoint(msgspec.Struct, tag="checkpoint"):
    """Compact the shard's durable log now (answered with ``Ack``)."""


class RawBatch(msgspec.Struct, tag="batch"):
    """A ``Batch`` as a shard sends it: each group is the msgpack frame it arrived in,
    forwarded without re-encoding. Same bytes on the wire as ``Batch``: decode either way."""

    request_id: int
    groups: list[msgspec.Raw]


ShardRequest = BatchRequest | StatsRequest | Reconfigure | Peek | Checkpoint
ShardReply = Batch | ShardStats | Ack | PeekReply


# ------------------------------------------------------------------ generator <-> controller


class AdmissionRequest(msgspec.Struct, tag="admission_request"):
    """A generator asks to start ``n_groups`` new prompt groups."""

    generator_id: int
    n_groups: int


class AdmissionReply(msgspec.Struct, tag="admission_reply"):
    """``granted`` groups may start now, on weights of version ``>= min_version`` (the oldest
    that keeps them within the staleness bound when the learner consumes them; DESIGN.md §3).
    ``stop`` tells the generator to finish: drain to ``learner_version`` and exit."""

    granted: int
    min_version: int
    learner_version: int
    max_staleness: int
    stop: bool = False
    # Live generator knobs (PATCH /config): applied from the next call on; None = unchanged.
    temperature: float | None = None
    prompts_per_call: int | None = None


# --------------------------------------------------------------------------- weights


class TensorPart(msgspec.Struct):
    """Rows ``[row_offset, row_offset + rows)`` of one tensor (a block of one learner rank's
    dim-0 shard; large shards are cut into several blocks), for one version.

    ``encoding``: ``dense`` (``values`` holds the whole block), ``sparse`` (``indices`` are flat
    positions in the block as LEB128 varints of the gaps between them; ``values`` the new bf16
    values at them) or ``bitmap`` (``indices`` is a packed bitmap over the block's elements).
    ``checksum`` is xxh64 of the complete new bf16 block, verified after applying.
    """

    name: str
    full_shape: tuple[int, ...]
    row_offset: int
    rows: int
    encoding: Literal["dense", "sparse", "bitmap"]
    values: bytes
    checksum: int
    indices: bytes = b""
    num_changed: int = 0


class WeightDiff(msgspec.Struct, tag="weight_diff"):
    """Version ``version`` of one rank's shard as a diff against ``base_version`` (``version -
    1`` unless the publisher coalesced versions it could not send in time)."""

    version: int
    base_version: int
    rank: int
    world_size: int
    parts: list[TensorPart]
    published_at: float
    chunk: int = 0
    num_chunks: int = 1
    # True: each part's values and indices follow this header as two extra ZeroMQ frames, in
    # part order (sent zero-copy); the header's parts then carry empty ``values``/``indices``.
    payload_frames: bool = False


class WeightAnchor(msgspec.Struct, tag="weight_anchor"):
    """A full snapshot of one rank's shard at ``version`` (dense parts only)."""

    version: int
    rank: int
    world_size: int
    parts: list[TensorPart]
    published_at: float
    chunk: int = 0
    num_chunks: int = 1
    payload_frames: bool = False  # as in ``WeightDiff``


class AnchorRequest(msgspec.Struct, tag="anchor_request"):
    subscriber_id: int


WeightMessage = WeightDiff | WeightAnchor


# --------------------------------------------------------------------------- metrics to controller


class LearnerStep(msgspec.Struct, tag="learner_step"):
    """Rank 0's summary of one optimizer step (the new version is ``version``)."""

    version: int
    metrics: dict[str, float]
    time: float


class GeneratorReport(msgspec.Struct, tag="generator_report"):
    generator_id: int
    applied_version: int
    tokens_generated: int
    groups_pushed: int
    checksum_failures: int
    anchors_applied: int
    time: float
    # The most recent versions applied and checksum-verified (the last 100 at most).
    verified_versions: list[int] = []
    anchors_requested: int = 0
    weights_bytes_received: int = 0
    weights_apply_s: float = 0.0
    weights_latency_s: float = 0.0  # publish to applied, for the last version


class ShardReport(msgspec.Struct, tag="shard_report"):
    stats: ShardStats
    time: float


Report = LearnerStep | GeneratorReport | ShardReport
