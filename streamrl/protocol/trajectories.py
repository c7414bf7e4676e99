"""What a generator sends: a ``Trajectory`` (one response, its tokens, behaviour logprobs and
versions as raw int32/float32 bytes) and a ``TrajectoryGroup`` (one prompt's responses, the
unit the buffer admits, stores and hands out), with the packing of their arrays."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable
from typing import Annotated, Literal

import msgspec

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
