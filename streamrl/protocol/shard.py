"""A buffer shard's requests and replies: batches taken by a learner (``BatchRequest``,
``Batch``, ``RawBatch``, ``TakeReceipt``), its stats, a live ``Reconfigure``, ``Peek`` and
``Checkpoint`` (``ShardRequest`` and ``ShardReply`` are the tagged unions)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from streamrl.protocol.trajectories import (
    MAX_CLIENT_NAME,
    MAX_FORKS,
    TrajectoryGroup,
)


class BatchRequest(msgspec.Struct, tag="batch_request"):
    """A learner rank asks one shard for up to ``k`` groups with ``min_version >= floor``.

    ``wait_ms`` makes it a long poll: the shard answers as soon as ``k`` eligible groups exist
    or when the wait runs out, with whatever it has (possibly none).

    ``client`` makes the take idempotent (``buffers.takes``): the shard keeps, and logs, the
    last take of each client, and answers the same ``request_id`` again with the same groups,
    across a restart too. So a client whose reply was lost asks again and loses nothing;
    request ids of one client must rise. Empty: no retry possible (a lost reply loses its
    groups).
    """

    request_id: int
    k: int
    floor: int
    learner_version: int
    wait_ms: int = 0
    client: Annotated[str, msgspec.Meta(max_length=MAX_CLIENT_NAME)] = ""
    # The learner clock (``streamrl.clock``): the group's epoch, the versions its epochs
    # resumed at, and its newest checkpoint (the shard keeps take receipts after it; -1:
    # none yet, so it keeps none: no learner could roll back to a checkpoint).
    learner_epoch: int = 0
    forks: Annotated[list[int], msgspec.Meta(max_length=MAX_FORKS)] = []
    checkpointed: int = -1


class Batch(msgspec.Struct, tag="batch"):
    request_id: int
    groups: list[TrajectoryGroup]


class StatsRequest(msgspec.Struct, tag="stats_request"):
    pass


class TakeReceipt(msgspec.Struct, array_like=True):
    """One take a shard handed out: for learner step ``step`` of epoch ``epoch``, the groups
    of these prompt indices (-1: a group from no stream)."""

    epoch: int
    step: int
    prompt_indices: list[int]


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
    # Durable shards, from the log, over every process that served the shard (restarts too):
    # received_total == sum(removed_total) + size + held, exactly.
    received_total: int = 0
    removed_total: dict[str, int] = {}
    # Acknowledged delivery (``buffers.delivery``): per sender, every group seq up to this one
    # has arrived (logged, when durable); and resent groups dropped as already arrived.
    delivered: dict[str, int] = {}
    resent_duplicates: int = 0
    # Batch requests that repeated a client's last take (its reply was lost or late): answered
    # again with the same groups, nothing taken (``buffers.takes``).
    retried_takes: int = 0
    # The learner clock the shard follows (``streamrl.clock``), and what each take since the
    # learners' newest checkpoint handed out: (epoch, step, prompt indices). A learner
    # restart hands exactly those prompts out again (``TakeReceipt``).
    learner_epoch: int = 0
    learner_version: int = 0
    receipts: list[TakeReceipt] = []
    # Groups refused at the door (would poison a learner), by reason; also in ``dropped``
    # as "invalid" (``buffers.frames.refusal``).
    invalid: dict[str, int] = {}
    # Per sender, the seqs above its ``delivered`` floor that have arrived too (a generator
    # pushes in the order scores settle, not its grant order): with the floors, exactly
    # which of a dead generator's grants a shard has (``PromptLedger.release``).
    delivered_above: dict[str, list[int]] = {}
    # Policy tokens of this shard process's groups by fate: "trained" (taken at least once)
    # or the reason they were dropped unused; and those stored now (``generation_yield``).
    tokens_by_fate: dict[str, int] = {}
    stored_policy_tokens: int = 0


class Reconfigure(msgspec.Struct, tag="reconfigure"):
    """Live-tunable buffer knobs; ``None`` leaves a knob unchanged."""

    capacity: int | None = None
    max_staleness: int | None = None
    sampling: str | None = None
    max_reuse: int | None = None
    overflow: str | None = None
    drop_zero_variance: bool | None = None


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
    learner_epoch: int = 0  # as ``BatchRequest``'s
    forks: Annotated[list[int], msgspec.Meta(max_length=MAX_FORKS)] = []


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
