"""Wire types shared by every role (docs/design.md §5).

All messages are ``msgspec.Struct``s encoded with msgpack. Arrays travel as raw bytes, never
as Python lists: a field's dtype is fixed by the field (documented at it) and its shape is
its length, or given by fields beside it (``TensorPart.full_shape``/``rows``). New fields are
appended at the end with defaults so that old peers keep decoding. Control messages are
tagged unions handled with ``match``.

This module is a leaf: stdlib and msgspec only (no torch, no numpy, no zmq).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable
from typing import Annotated, Literal, NamedTuple

import msgspec

# --------------------------------------------------------------------------- trajectories

MAX_CLIENT_NAME = 128  # a learner client's name in ``BatchRequest.client``
MAX_FORKS = 1024  # learner restarts a request may list (``BatchRequest.forks``)
# A group's delivery sender (``TrajectoryGroup.sender``): a generator's are 14 to 18
# characters (``buffers.delivery.shard_sender``).
MAX_SENDER_NAME = 64
MAX_SEQ = 10**18 - 1  # the largest ``TrajectoryGroup.seq`` a group id can carry (18 digits)

# Dtypes of the trajectory arrays: raw little-endian bytes, 4 bytes per element, one element
# per token. Token ids and versions are int32 (``array`` typecode ``i``), behaviour logprobs
# float32 (``f``): the engines compute them in float32, so nothing is lost.
TOKEN_DTYPE, LOGPROB_DTYPE, VERSION_DTYPE = "int32", "float32", "int32"
_ITEMSIZE = 4
_LITTLE_ENDIAN = sys.byteorder == "little"
assert array("i").itemsize == array("f").itemsize == _ITEMSIZE


def pack_int32(values: Iterable[int]) -> bytes:
    """Little-endian int32 bytes of ``values`` (``OverflowError`` outside the int32 range)."""
    packed = array("i", values)
    if not _LITTLE_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def pack_float32(values: Iterable[float]) -> bytes:
    """Little-endian float32 bytes of ``values`` (exact for values that are float32 already)."""
    packed = array("f", values)
    if not _LITTLE_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def unpack_int32(data: bytes) -> list[int]:
    """``pack_int32``'s inverse: the values of little-endian int32 bytes."""
    return _unpack(data, "i")


def unpack_float32(data: bytes) -> list[float]:
    """``pack_float32``'s inverse: the values of little-endian float32 bytes."""
    return _unpack(data, "f")


def _unpack(data: bytes, typecode: str) -> list:
    if _LITTLE_ENDIAN:
        return memoryview(data).cast(typecode).tolist()
    values = array(typecode, data)
    values.byteswap()
    return values.tolist()


# How a trajectory ended: ``stop`` (its end-of-turn token, or the environment's normal end of
# an episode), ``length`` (a token limit), ``abort`` (the engine gave up), and for episodes
# ``turns`` (``env.max_turns`` reached) and ``error`` (a malformed tool call, an environment
# that raised or hung: ``Trajectory.end_reason`` says which).
FinishReason = Literal["stop", "length", "abort", "turns", "error"]


class Trajectory(msgspec.Struct):
    """One sampled response to one prompt; its token arrays are raw bytes (docs/design.md §5).

    ``prompt_ids``, ``response_ids`` and ``token_versions`` are little-endian int32 and
    ``behavior_logprobs`` little-endian float32, one element (4 bytes) per token.
    ``behavior_logprobs[i]`` is the log-probability of ``response_ids[i]`` under the
    distribution the generator actually sampled from; ``token_versions[i]`` is the weight
    version that produced that token (in-flight updates make one trajectory span versions).

    Build one from lists with ``Trajectory.from_lists``, or pass bytes straight from a
    tensor (``t.to(torch.int32).numpy().tobytes()``). msgspec checks only that the arrays
    are bytes: a receiver calls ``check()`` before trusting their lengths.

    Example::

        t = Trajectory.from_lists([1, 2], [3, 4, 5], [-0.5, -1.0, -0.25], [0, 0, 1], 1.0,
                                  "stop", generator_id=0)
        t.num_response_tokens, t.min_version, t.max_version   # (3, 0, 1)
        t.response_list()                                      # [3, 4, 5]
    """

    prompt_ids: bytes
    response_ids: bytes
    behavior_logprobs: bytes
    token_versions: bytes
    reward: float
    finish_reason: FinishReason
    generator_id: int
    response_text: str = ""
    # Sampling temperature of this response; the learner scores it at the same temperature.
    temperature: float = 1.0
    # Multi-turn episodes (``streamrl.envs``): one byte per response token, 1 where the policy
    # sampled it, 0 where the environment wrote it (context: no loss, advantage, KL, entropy or
    # mismatch figure; its logprob is 0 and its version the one held when it was appended).
    # Empty: every response token is the policy's (a single-turn trajectory).
    action_mask: bytes = b""
    # The policy turns the episode took (0: a single-turn trajectory) and, when it ended other
    # than by the environment's normal end, why (a malformed tool call, a limit, an error).
    turns: int = 0
    end_reason: str = ""
    # Each configured reward's own score of this response, in ``rewards:`` order, before
    # normalisation and weighting (NaN: a served scorer could not score it, counted); empty
    # when the job has one rule reward and no normalisation (``reward`` is that score).
    reward_parts: list[float] = []
    # On-policy distillation (``rewards: - teacher``, docs/design.md §7d): the teachers'
    # log-probability of each response token at this response's temperature (little-endian
    # float32, one per response token; weighted by ``teacher_coef`` where several teachers
    # scored it), and the coefficient the learner gives ``teacher - behaviour`` in each
    # policy token's advantage. Empty and 0: no teacher scored this response.
    teacher_logprobs: bytes = b""
    teacher_coef: float = 0.0
    # A top-k teacher's (``teacher.top_k``): its k likeliest tokens at each response position
    # (int32) and their logprobs (float32), k per token, and the forward-KL term's weight.
    teacher_top_ids: bytes = b""
    teacher_top_logprobs: bytes = b""
    teacher_top_coef: float = 0.0
    # The version of the lagged teacher (``teacher.model: self``) that scored it, when it was
    # the only teacher to; -1: none (or other teachers too, whose term keeps a flat group).
    teacher_version: int = -1
    # Off-policy guidance (``algorithm.guidance``, workers/generation/guidance.py): the
    # prompt's reference response, never sampled. Its behaviour logprobs are unknown (zeros):
    # the learner takes its proximal logprobs in their place (correction weight 1) and leaves
    # it out of the mismatch figures; its tokens are not generation (``num_policy_tokens`` 0).
    guided: bool = False

    @classmethod
    def from_lists(
        cls,
        prompt_ids: Iterable[int],
        response_ids: Iterable[int],
        behavior_logprobs: Iterable[float],
        token_versions: Iterable[int],
        reward: float,
        finish_reason: FinishReason,
        generator_id: int,
        response_text: str = "",
        temperature: float = 1.0,
        action_mask: Iterable[int] | None = None,
    ) -> Trajectory:
        """Pack Python sequences (``OverflowError``/``TypeError`` if one does not fit its dtype)."""
        return cls(
            pack_int32(prompt_ids),
            pack_int32(response_ids),
            pack_float32(behavior_logprobs),
            pack_int32(token_versions),
            reward,
            finish_reason,
            generator_id,
            response_text,
            temperature,
            bytes(action_mask) if action_mask is not None else b"",
        )

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids) // _ITEMSIZE

    @property
    def num_response_tokens(self) -> int:
        return len(self.response_ids) // _ITEMSIZE

    @property
    def min_version(self) -> int:
        """The lowest token version (0 for an empty response)."""
        return self.version_range()[0]

    @property
    def max_version(self) -> int:
        """The highest token version (0 for an empty response)."""
        return self.version_range()[1]

    def version_range(self) -> tuple[int, int]:
        """``(min_version, max_version)`` in one pass."""
        data = self.token_versions
        n = len(data) // _ITEMSIZE
        if n == 0:
            return 0, 0
        if len(data) != n * _ITEMSIZE:  # malformed (``check`` says so): read whole elements
            data = data[: n * _ITEMSIZE]
        first = data[:_ITEMSIZE]
        if data == first * n:  # one version throughout, the common case: no unpacking
            version = int.from_bytes(first, "little", signed=True)
            return version, version
        versions = set(_unpack(data, "i"))  # a few distinct values: a set is ~2x faster
        return min(versions), max(versions)

    def check(self) -> str | None:
        """``None`` if the arrays are consistent, else a one-line reason: every array must be
        whole 4-byte elements, and there must be one logprob and one version per response
        token."""
        for name in ("prompt_ids", "response_ids", "behavior_logprobs", "token_versions"):
            size = len(getattr(self, name))
            if size % _ITEMSIZE:
                return f"{name} has {size} bytes, not a multiple of {_ITEMSIZE}"
        n = self.num_response_tokens
        logprobs = len(self.behavior_logprobs) // _ITEMSIZE
        versions = len(self.token_versions) // _ITEMSIZE
        if not n == logprobs == versions:
            return f"{n} response tokens, {logprobs} logprobs, {versions} versions"
        if self.action_mask:
            if len(self.action_mask) != n:
                return f"{n} response tokens, {len(self.action_mask)} action mask bytes"
            if self.action_mask.translate(None, b"\x00\x01"):
                return "action_mask holds a byte other than 0 and 1"
        if self.teacher_logprobs and len(self.teacher_logprobs) != n * _ITEMSIZE:
            return f"{n} response tokens, {len(self.teacher_logprobs)} teacher logprob bytes"
        top = len(self.teacher_top_ids)
        if top != len(self.teacher_top_logprobs) or (top and (not n or top % (n * _ITEMSIZE))):
            return (
                f"{n} response tokens, {top} teacher top-k id bytes, "
                f"{len(self.teacher_top_logprobs)} top-k logprob bytes"
            )
        return None

    def prompt_list(self) -> list[int]:
        return _unpack(self.prompt_ids, "i")

    def response_list(self) -> list[int]:
        return _unpack(self.response_ids, "i")

    def logprob_list(self) -> list[float]:
        return _unpack(self.behavior_logprobs, "f")

    def version_list(self) -> list[int]:
        return _unpack(self.token_versions, "i")

    def policy_mask(self) -> bytes:
        """One byte per response token: 1 where the policy sampled it, 0 where an environment
        wrote it (``action_mask``, whose empty form means every token is the policy's)."""
        return self.action_mask or b"\x01" * self.num_response_tokens

    def action_mask_list(self) -> list[int]:
        return list(self.policy_mask())

    @property
    def num_policy_tokens(self) -> int:
        """The response tokens the policy sampled (``policy_mask``'s ones; none in a guided
        reference response, which was written, not sampled)."""
        if self.guided:
            return 0
        mask = self.policy_mask()
        return len(mask) - mask.count(0)


class TrajectoryGroup(msgspec.Struct):
    """All samples of one prompt; GRPO needs the group whole, so it is never split."""

    group_id: str
    prompt_id: str
    trajectories: list[Trajectory]
    created_at: float
    finished_at: float
    data_source: str = ""
    ground_truth: str = ""
    # The prompt's index in the run's stream (``data.PromptStream``; -1: not from one): a
    # learner restart puts the prompts of the steps it lost back into the stream.
    prompt_index: int = -1
    # The learner epoch of the weights the group started on (``streamrl.clock``): with its
    # versions it says whether those weights are still on the learner's timeline.
    weights_epoch: int = 0
    # Its delivery identity (``buffers.delivery``), given once, when the generator assigns it
    # to a shard: the generator process's sender name for that shard, and the group's count
    # among those it sent there. ``group_id`` is then ``<sender>-<seq>`` (the durable log and
    # exports key on the id). A frame from before these fields (sender "", seq -1) carries its
    # identity only in its id, which the shard parses.
    sender: Annotated[str, msgspec.Meta(max_length=MAX_SENDER_NAME)] = ""
    seq: Annotated[int, msgspec.Meta(ge=-1, le=MAX_SEQ)] = -1
    # The served scorers (reward models, judges) that scored this group, each as
    # ``"<label>@<weights hash>"`` (``streamrl.rewards.scorer``); empty: rules only.
    scorers: list[str] = []
    # Why its served scores could not be had (timeouts used up, a scorer's error), or "": a
    # group pushed only so that the shard counts and drops it (``unscored``), which returns
    # its admission budget and settles its prompt as any dropped group's.
    unscored: str = ""
    # The incarnation of the reward role behind each of ``scorers`` (same order): a role's
    # restart keeps its identity (same weights), so this tells which process scored it.
    scorer_incarnations: list[int] = []

    @property
    def min_version(self) -> int:
        return self.version_range()[0]

    @property
    def max_version(self) -> int:
        return self.version_range()[1]

    def version_range(self) -> tuple[int, int]:
        """``(min_version, max_version)`` in one pass over the trajectories with tokens (an
        empty response has no version: it must not make its group look version 0, i.e.
        maximally stale); ``(0, 0)`` if none has."""
        ranges = [t.version_range() for t in self.trajectories if t.token_versions]
        if not ranges:
            return 0, 0
        return min(lo for lo, _ in ranges), max(hi for _, hi in ranges)

    @property
    def num_tokens(self) -> int:
        return sum(t.num_prompt_tokens + t.num_response_tokens for t in self.trajectories)

    @property
    def policy_tokens(self) -> int:
        """The tokens the policy sampled (an episode's environment tokens not counted): what
        generation paid for, as ``tokens_generated`` counts it (``generation_yield``)."""
        return sum(t.num_policy_tokens for t in self.trajectories)

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    @property
    def distilled(self) -> bool:
        """A teacher scored its tokens: its distillation term teaches even where every reward
        is alike, so no zero-variance rule drops it. Not a lagged copy of the student alone
        (``teacher_version >= 0``): it knows nothing the student does not, its term only
        holds the student near a recent self, and flat groups kept for it diluted the
        reward's signal (docs/experiments.md, 2026-12-02, night)."""
        return any(
            (t.teacher_coef > 0 or t.teacher_top_coef > 0) and t.teacher_version < 0
            for t in self.trajectories
        )

    @property
    def nbytes(self) -> int:
        """Bytes of its token arrays and response texts (characters): about its wire size,
        and what a learner holds of it."""
        return sum(
            len(t.prompt_ids)
            + len(t.response_ids)
            + len(t.behavior_logprobs)
            + len(t.token_versions)
            + len(t.teacher_logprobs)
            + len(t.teacher_top_ids)
            + len(t.teacher_top_logprobs)
            + len(t.response_text)
            for t in self.trajectories
        )

    def check(self) -> str | None:
        """``None`` if every trajectory passes ``Trajectory.check``, else the first reason."""
        for i, t in enumerate(self.trajectories):
            reason = t.check()
            if reason is not None:
                return f"trajectory {i}: {reason}"
        return None


# --------------------------------------------------------------------------- buffer <-> learner


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


# ------------------------------------------------------------------ generator <-> controller


class AdmissionRequest(msgspec.Struct, tag="admission_request"):
    """A generator asks to start ``n_groups`` new prompt groups."""

    generator_id: int
    n_groups: int
    incarnation: int = 0  # a replaced generator's successor asks with a higher one
    sender: str = ""  # its group ids' sender name (``buffers.delivery``): the reply's receipts


class Grant(msgspec.Struct, omit_defaults=True):
    """Groups a generator may start now: ``granted`` of them, for the run's prompts
    ``prompt_indices`` in order (``data.PromptStream``), on weights of version
    ``>= min_version`` (the oldest that keeps them within the staleness bound when the learner
    consumes them; docs/design.md §3)."""

    granted: int = 0
    min_version: int = 0
    prompt_indices: list[int] = []
    # Probe sampling (``generator.probe_candidates`` K >= 2): K - 1 fresh prompt indices more
    # per granted group, among which the generator chooses its groups' prompts by a probe
    # each (``workers.generation.probing``); the ones not chosen are passed over.
    candidates: list[int] = []


class Directives(msgspec.Struct, omit_defaults=True):
    """What the controller tells a generator to do besides generating."""

    # Finish: drain to the learner's version (``LearnerClockInfo``) and exit.
    stop: bool = False
    # Leave the run (``generator.count`` lowered, or a replaced generator's predecessor): finish
    # now, without draining to the end.
    retire: bool = False
    # Evaluate the held-out prompts on weights of at least this version before the next call,
    # then send an ``EvalReport`` (-1: no evaluation asked; only generator 0 is asked: a
    # replaced generator keeps its id and scaling down retires the highest ids).
    eval_version: int = -1
    # Live generator knobs (PATCH /config, ``controller.knobs``): applied from the next call
    # on; None = unchanged.
    temperature: float | None = None
    prompts_per_call: int | None = None
    # The learner epoch of ``eval_version`` (``streamrl.clock``): weights of an older epoch
    # past its fork no longer exist, so an evaluation waits for this epoch's version.
    eval_epoch: int = 0


class LearnerClockInfo(msgspec.Struct, omit_defaults=True):
    """The learner clock as the controller last heard it (``streamrl.clock``)."""

    learner_version: int = 0
    # The learner group's incarnation: it rises when the group restarts from a checkpoint, whose
    # versions repeat numbers a generator may hold already, so it re-anchors every rank.
    weights_epoch: int = 0


class Receipts(msgspec.Struct, omit_defaults=True):
    """Acknowledged delivery (``buffers.delivery``): per shard id, the floor of the asking
    generator's groups that shard has (the generator forgets them), and how often the shard was
    restarted (a rise: send it every group it has not acknowledged again)."""

    delivered: dict[int, int] = {}
    shard_epochs: dict[int, int] = {}
    # Per reward role (its reward's index in ``rewards:``), how often it was restarted: a rise
    # means requests in flight to it were lost, and the generator sends them again.
    scorer_epochs: dict[int, int] = {}
    # Per reward role, the endpoint of its current incarnation: a role restarted on another
    # node (or port) is reached there; the generator reconnects when it changes.
    scorer_endpoints: dict[int, str] = {}


class ReplyParts(NamedTuple):
    """An ``AdmissionReply``'s four parts."""

    grant: Grant
    directives: Directives
    clock: LearnerClockInfo
    receipts: Receipts


class AdmissionReply(msgspec.Struct, tag="admission_reply", omit_defaults=True):
    """The controller's answer to an ``AdmissionRequest``, in four parts that a generator
    handles one method each: the ``grant``, the ``directives``, the learner ``clock`` and the
    delivery ``receipts``. Read them with ``parts()``.

    A reply never outlives the launch that sent it (controller and generators start together),
    so unlike ``TrajectoryGroup`` it keeps no older form: a part left out decodes to its default.

    Example::

        reply = AdmissionReply(grant=Grant(2, 5, [40, 41]), clock=LearnerClockInfo(6))
        grant, directives, clock, receipts = reply.parts()
        grant.granted, directives.stop, receipts.delivered   # (2, False, {})
    """

    grant: Grant = msgspec.field(default_factory=Grant)
    directives: Directives = msgspec.field(default_factory=Directives)
    clock: LearnerClockInfo = msgspec.field(default_factory=LearnerClockInfo)
    receipts: Receipts = msgspec.field(default_factory=Receipts)

    def parts(self) -> ReplyParts:
        return ReplyParts(self.grant, self.directives, self.clock, self.receipts)


# --------------------------------------------------------------------------- weights

# Elements per window of a sparse part's index: a window's count and offsets fit a byte.
SPARSE_WINDOW = 255


class TensorPart(msgspec.Struct):
    """Rows ``[row_offset, row_offset + rows)`` of one tensor (a block of one learner rank's
    dim-0 shard; large shards are cut into several blocks), for one version.

    ``encoding``: ``dense`` (``values`` holds the whole block), ``sparse`` (``indices`` are the
    block's changed positions, a byte per ``SPARSE_WINDOW``-element window counting them then
    a byte per position for its offset in its window: ``sparse_index.encode_positions``;
    ``values`` the new bf16 values at them) or ``bitmap`` (``indices`` is a packed bitmap over
    the block's elements).
    ``checksum`` is XXH3-64 of the complete new bf16 block, verified after applying.
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


class ImageChecksum(msgspec.Struct):
    """Whole-image checksum of one learner rank's shard at a diff's version (docs/design.md §4,
    ``weights.verify_every``): catches a block that diverged silently and that no diff touches
    again, which the per-block checksums never see. The shard is ``names[i]``'s rows
    ``[row_offsets[i], row_offsets[i] + rows[i])`` in this order; ``digests`` holds XXH3-64 of
    each of those row ranges' bf16 bytes (little-endian uint64s, one per name) and ``checksum``
    is XXH3-64 of ``digests``."""

    names: list[str]
    row_offsets: list[int]
    rows: list[int]
    digests: bytes
    checksum: int


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
    # How many chunks the version has; the publisher streams a diff's chunks as it encodes
    # them, so only the last carries the count and the ones before it say 0.
    num_chunks: int = 1
    # True: each part's values and indices follow this header as two extra ZeroMQ frames, in
    # part order (sent zero-copy); the header's parts then carry empty ``values``/``indices``.
    payload_frames: bool = False
    # On the last chunk of a version the publisher verifies (every ``weights.verify_every``
    # versions, and when a checkpoint is saved): the rank's whole shard after this version.
    image_checksum: ImageChecksum | None = None


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
    """Rank 0's summary of one optimizer step (the new version is ``version``).
    ``incarnation``: the learner group's restarts so far; the controller ignores reports of a
    group it replaced."""

    version: int
    metrics: dict[str, float]
    time: float
    incarnation: int = 0


class BatchTaken(msgspec.Struct, tag="batch_taken"):
    """One learner rank took its batch for step ``version`` (the version it will make): the
    stream indices of its groups' prompts (``TrajectoryGroup.prompt_index``). Sent before the
    step trains, so a resume from an older checkpoint can hand them out again."""

    rank: int
    version: int
    prompt_indices: list[int]
    incarnation: int = 0  # as ``LearnerStep.incarnation``


class GeneratorActivity(msgspec.Struct):
    """Cumulative seconds a generator spent by activity, timed inside its loop, and its calls
    (``streamrl bench``): generating and scoring; waiting for admission; waiting for a version
    it must hold; applying weights (between calls or in flight, while decoding pauses);
    evaluating."""

    busy_s: float = 0.0
    calls: int = 0  # generation calls (each decodes its granted groups' rows together)
    wait_admission_s: float = 0.0
    wait_weights_s: float = 0.0
    weights_pause_s: float = 0.0
    eval_s: float = 0.0


class WeightStages(msgspec.Struct):
    """Where the newest version a generator adopted spent its time from publish to adopted,
    stage by stage (wall seconds, docs/design.md §4), so that a slower weight path names its
    stage: ``arrive_s`` publish -> the version's last chunk taken off the socket by the weight
    thread (the learner's snapshot, encode and send, the wire, and that thread's write-ahead of
    the chunks before: the learner's ``weights/out_s`` splits it); ``queue_s`` received
    -> the weight thread starts on it; ``apply_s`` decoded, written into the image and
    verified; ``prepare_s`` the engine's copies made (``Engine.prepare_weights``); ``adopt_s``
    prepared -> adopted between decode steps. Their sum is ``GeneratorReport.weights_latency_s``
    (to the clocks' agreement where learner and generator are different hosts)."""

    version: int = -1
    arrive_s: float = 0.0
    queue_s: float = 0.0
    apply_s: float = 0.0
    prepare_s: float = 0.0
    adopt_s: float = 0.0


# The stages' names, in order, read off the struct (one list to keep).
WEIGHT_STAGES = tuple(f.removesuffix("_s") for f in WeightStages.__struct_fields__[1:])


OUTCOME_WINDOW = 512  # GeneratorReport.outcome_*: enough for the groups between two reports


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
    weights_stages: WeightStages = msgspec.field(default_factory=WeightStages)  # the same, split
    activity: GeneratorActivity = msgspec.field(default_factory=lambda: GeneratorActivity())
    incarnation: int = 0  # reports of a replaced generator's predecessor are ignored
    # Whole-image verifications of a learner shard (``ImageChecksum``): passed, and failed (each
    # failure repaired by an anchor of that rank).
    images_verified: int = 0
    image_mismatches: int = 0
    # Groups refused because a rule reward raised on one of their responses, or the rule
    # worker died scoring them (``workers.generation.rule_worker``; each logged with the reason).
    reward_errors: int = 0
    # The learner epoch of ``applied_version`` (``streamrl.clock``).
    weights_epoch: int = 0
    # Multi-turn episodes by how they ended (``stop``, ``length``, ``turns``, ``error``, ...)
    # and, for those that ended in error, by reason (``streamrl.envs``): totals of this process.
    episode_ends: dict[str, int] = {}
    episode_errors: dict[str, int] = {}
    # The newest scored groups (at most ``OUTCOME_WINDOW``) as (prompt index, flat: every
    # sample scored alike), and how many this incarnation scored in all: the difficulty
    # sampler's input (``controller.difficulty``).
    outcome_indices: list[int] = []
    outcome_flat: list[bool] = []
    outcomes_total: int = 0
    scoring: ScoringFigures = msgspec.field(default_factory=lambda: ScoringFigures())
    # Groups refused because their rules outran ``scoring.rule_timeout_s`` (the rule worker
    # was killed and started again), and the seconds the generator waited for rule scores:
    # totals of this process.
    reward_timeouts: int = 0
    rules_wait_s: float = 0.0
    # Probe sampling: the tokens of probes whose prompts were passed over (counted in
    # ``tokens_generated`` too; ``controller.generation_yield`` calls them lost to ``probe``).
    probe_tokens_passed_over: int = 0
    # Off-policy guidance (``algorithm.guidance``): the groups trained with their reference,
    # and the generated tokens of the samples the references displaced (lost to ``guidance``).
    groups_guided: int = 0
    guidance_tokens_displaced: int = 0
    # Screening (``generator.screen_samples``): the groups settled by their first samples
    # (delivered flat, their tokens lost to ``zero_variance``), and the samples they were spared.
    groups_settled_early: int = 0
    samples_spared: int = 0


class ShardReport(msgspec.Struct, tag="shard_report"):
    stats: ShardStats
    time: float


class EvalAnswer(msgspec.Struct):
    """One kept held-out response (``eval.keep_answers``, ``streamrl.eval_answers``):
    ``reward`` is the rules' combined score, ``served`` each served reward's by its label
    (None: unparsable or not answered in time)."""

    prompt_id: str
    question: str
    response: str
    ground_truth: str
    reward: float
    exact: bool
    stopped: bool
    served: dict[str, float | None] = {}


class EvalReport(msgspec.Struct, tag="eval_report"):
    """Held-out evaluation figures (``workers.generation.evaluator.evaluate``) of weights
    ``version`` of
    learner epoch ``weights_epoch``, asked for at ``requested`` (the generator may hold a newer
    version by then), with the responses kept (``answers``)."""

    generator_id: int
    requested: int
    version: int
    metrics: dict[str, float]
    time: float
    weights_epoch: int = 0
    answers: list[EvalAnswer] = []


class ScoreItemWire(msgspec.Struct, array_like=True):
    """One response to score (``streamrl.rewards.scorer.ScoreItem`` on the wire). A teacher
    is sent the tokens as sampled (int32 arrays, as ``Trajectory``'s) and their temperature;
    a reward model or judge only the text."""

    prompt: str
    response: str
    ground_truth: str = ""
    prompt_ids: bytes = b""
    response_ids: bytes = b""
    temperature: float = 1.0
    stopped: bool = True  # False: cut at the token limit (``ScoreItem.stopped``)


class ScoreRequest(msgspec.Struct, tag="score_request"):
    """A generator's group (or an evaluation's responses) sent to a reward role: scored in
    one reply. ``request_id`` is unique per generator process; a reply to an id already
    answered is counted and ignored (a retried request answered twice)."""

    request_id: Annotated[str, msgspec.Meta(max_length=MAX_SENDER_NAME + 24)]
    items: list[ScoreItemWire]
    # How long after this send its sender waits for the reply (``scoring.timeout_s``; 0:
    # for ever). The role drops a request still queued that long after it arrived, counted
    # ``expired``: its sender has sent it again or given its group up. Relative, not a
    # clock time, so that the role's and the sender's clocks need not agree.
    expires_in_s: float = 0.0
    # The group's newest behaviour version and its learner epoch (-1: an evaluation's
    # responses): a lagged teacher (``teacher.model: self``) follows the student's weights by
    # them (docs/design.md §7d).
    version: int = -1
    weights_epoch: int = 0


class ScoreReply(msgspec.Struct, tag="score_reply"):
    request_id: str
    # One per item; None: the scorer could not score it (a judge's unparsable verdict).
    scores: list[float | None]
    identity: str  # "<label>@<weights hash>" of the scorer that scored them
    # Set when the role refused or failed the request (the scores are then empty).
    error: str = ""
    incarnation: int = 0  # the answering role's (``RewardRoleSpec.incarnation``)
    # A teacher's answer: per item, the log-probability of each response token (float32
    # bytes, one per token); ``scores`` then holds each item's mean of them. A top-k
    # teacher's: per item, its k likeliest tokens at each position (int32) and their
    # logprobs (float32).
    token_logprobs: list[bytes] = []
    top_ids: list[bytes] = []
    top_logprobs: list[bytes] = []
    # A lagged teacher's: the version of the student's weights it scored with (-1: a teacher
    # of fixed weights, or no teacher).
    teacher_version: int = -1


class RewardRoleReport(msgspec.Struct, tag="reward_report"):
    """A reward role's totals (``workers.reward_roles.reward_role``), sent every second:
    the controller's ``/status``, ``summary.json`` and the bench read them."""

    index: int  # the reward's position in ``rewards:``
    incarnation: int
    label: str
    identity: str
    time: float
    requests: int = 0
    items: int = 0
    batches: int = 0
    busy_s: float = 0.0  # scoring (forward passes)
    up_s: float = 0.0  # since the scorer was ready
    queue_depth: int = 0  # requests received and not yet answered, now
    queue_wait_s: float = 0.0  # summed over requests: received -> its batch started
    latency_p50_s: float = 0.0  # received -> answered, over the newest requests
    latency_p95_s: float = 0.0
    failures: int = 0  # batches whose scoring raised (their requests answered with error)
    unparsable: int = 0  # items scored None
    malformed: int = 0  # frames that did not decode (counted, dropped)
    # Requests dropped unscored because their sender had given up on them (queued past
    # their ``expires_in_s``), and queued ones replaced by their sender's resend (same id).
    expired: int = 0
    replaced: int = 0
    # Requests refused because two incarnations of this role died scoring them.
    quarantined: int = 0
    # The ids of the requests in the batch being scored now (sent before the batch starts,
    # empty after it): if the role dies meanwhile, the controller knows whom to suspect.
    scoring_ids: list[str] = []


class ScoringFigures(msgspec.Struct):
    """A generator's side of scoring (``workers.generation.scoring``), totals of this process."""

    waiting: int = 0  # groups sampled and waiting for their scores, now
    sent: int = 0  # requests sent (first tries and retries)
    retries: int = 0  # requests sent again: past their timeout, or their role restarted
    timeouts: int = 0
    refused: int = 0  # groups given up (attempts used up, or an error reply), not pushed
    duplicates: int = 0  # replies to requests already answered (ignored)
    # Of ``refused``: a lagged teacher's copy was more than ``teacher.lag_bound`` behind.
    teacher_lagged: int = 0
    unparsable: dict[str, int] = {}  # per scorer label: items scored None (imputed, counted)
    wait_s: float = 0.0  # summed over scored groups: sampled -> every score in


class Heartbeat(msgspec.Struct, tag="heartbeat"):
    """Sent every second by a thread of the role's process, whatever its main loop is doing:
    a process that stops sending (killed, SIGSTOPped) misses its heartbeats; one whose main
    loop is wedged (a forward, a hung reward) keeps sending them with ``stalled_s`` rising
    (``workers.progress``)."""

    role: str  # "generator"
    index: int
    incarnation: int
    time: float
    progress: int = 0  # steps of work made (decode steps, batches scored, versions adopted)
    stalled_s: float = 0.0  # seconds with work in hand and no step; 0 while idle


Report = (
    LearnerStep
    | GeneratorReport
    | ShardReport
    | EvalReport
    | Heartbeat
    | BatchTaken
    | RewardRoleReport
)
