"""Wire types shared by every role (docs/design.md §5).

All messages are ``msgspec.Struct``s encoded with msgpack. Arrays travel as raw bytes, never
as Python lists: a field's dtype is fixed by the field (documented at it) and its shape is
its length, or given by fields beside it (``TensorPart.full_shape``/``rows``). New fields are
appended at the end with defaults so that old peers keep decoding. Control messages are
tagged unions handled with ``match``.

The package's parts, one per conversation: ``trajectories`` (generator -> buffer),
``shard`` (learner and controller <-> buffer shard), ``admission`` (generator <->
controller), ``weights`` (publisher -> subscribers), ``scoring`` (generator <-> reward roles)
and ``reports`` (every role -> controller).

This package is a leaf: stdlib and msgspec only (no torch, no numpy, no zmq).
"""

from __future__ import annotations

from streamrl.protocol.admission import (
    AdmissionReply,
    AdmissionRequest,
    Directives,
    Grant,
    LearnerClockInfo,
    Receipts,
    ReplyParts,
)
from streamrl.protocol.reports import (
    OUTCOME_WINDOW,
    WEIGHT_STAGES,
    BatchTaken,
    EvalAnswer,
    EvalReport,
    GeneratorActivity,
    GeneratorReport,
    Heartbeat,
    LearnerStep,
    Report,
    RewardRoleReport,
    ScoringFigures,
    ShardReport,
    WeightStages,
)
from streamrl.protocol.scoring import ScoreItemWire, ScoreReply, ScoreRequest
from streamrl.protocol.shard import (
    Ack,
    Batch,
    BatchRequest,
    Checkpoint,
    Peek,
    PeekReply,
    RawBatch,
    Reconfigure,
    ShardReply,
    ShardRequest,
    ShardStats,
    StatsRequest,
    TakeReceipt,
)
from streamrl.protocol.trajectories import (
    LOGPROB_DTYPE,
    MAX_CLIENT_NAME,
    MAX_FORKS,
    MAX_SENDER_NAME,
    MAX_SEQ,
    TOKEN_DTYPE,
    VERSION_DTYPE,
    FinishReason,
    Trajectory,
    TrajectoryGroup,
    pack_float32,
    pack_int32,
    unpack_float32,
    unpack_int32,
)
from streamrl.protocol.weights import (
    SPARSE_WINDOW,
    AnchorRequest,
    ImageChecksum,
    TensorPart,
    WeightAnchor,
    WeightDiff,
    WeightMessage,
)

__all__ = [
    "Ack",
    "AdmissionReply",
    "AdmissionRequest",
    "AnchorRequest",
    "Batch",
    "BatchRequest",
    "BatchTaken",
    "Checkpoint",
    "Directives",
    "EvalAnswer",
    "EvalReport",
    "FinishReason",
    "GeneratorActivity",
    "GeneratorReport",
    "Grant",
    "Heartbeat",
    "ImageChecksum",
    "LOGPROB_DTYPE",
    "LearnerClockInfo",
    "LearnerStep",
    "MAX_CLIENT_NAME",
    "MAX_FORKS",
    "MAX_SENDER_NAME",
    "MAX_SEQ",
    "OUTCOME_WINDOW",
    "Peek",
    "PeekReply",
    "RawBatch",
    "Receipts",
    "Reconfigure",
    "ReplyParts",
    "Report",
    "RewardRoleReport",
    "SPARSE_WINDOW",
    "ScoreItemWire",
    "ScoreReply",
    "ScoreRequest",
    "ScoringFigures",
    "ShardReply",
    "ShardReport",
    "ShardRequest",
    "ShardStats",
    "StatsRequest",
    "TOKEN_DTYPE",
    "TakeReceipt",
    "TensorPart",
    "Trajectory",
    "TrajectoryGroup",
    "VERSION_DTYPE",
    "WEIGHT_STAGES",
    "WeightAnchor",
    "WeightDiff",
    "WeightMessage",
    "WeightStages",
    "pack_float32",
    "pack_int32",
    "unpack_float32",
    "unpack_int32",
]
