"""Ingest frames -> what a shard stores: one decode and check per group, the frame kept.

A shard decodes every ``TrajectoryGroup`` frame fully: its token arrays are msgpack ``bin``
(raw bytes, docs/design.md §5), so decoding copies them instead of parsing numbers, and then it
checks the arrays (``TrajectoryGroup.check``) and the versions. It keeps only a summary (ids,
versions, sizes, rewards) plus the frame itself: memory stays at wire size, the durable log
stores the frame as the group's payload, and replies forward it unchanged (``RawBatch``),
with no re-encoding.

Malformed input (garbage, truncated msgpack, invalid UTF-8, nesting too deep, wrong types or
kinds, inconsistent array lengths, negative versions, a delivery identity its id contradicts,
wrong frame counts) is counted by kind, logged once per kind and dropped. Nothing is unpickled.

A group that decodes but would poison a learner (``refusal``: no trajectories, an empty prompt,
responses all empty, a reward or logprob that is NaN or infinite, a temperature <= 0, a token
id outside the model's vocabulary) is refused at the door: the shard acknowledges it (its
sender must not resend it), counts it by reason and drops it, so its budget returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from streamrl.protocol import TrajectoryGroup
from streamrl.transport import Codec

from .delivery import identity_error


@dataclass(slots=True, eq=False)
class StoredGroup:
    """What a shard holds for one group: what its store and durable log read (the
    ``replay.Group`` and ``log_segments.LoggedGroup`` protocols), computed once, and the
    frame the group arrived in."""

    group_id: str
    prompt_id: str
    created_at: float
    finished_at: float
    min_version: int
    max_version: int
    num_tokens: int
    nbytes: int
    rewards: list[float]
    frame: bytes
    weights_epoch: int = 0
    policy_tokens: int = 0
    prompt_index: int = -1
    refused: str = ""  # why the door refuses it (``refusal``); "" if it may pass
    # Its delivery identity (``buffers.delivery``; sender "": a frame from before it).
    sender: str = ""
    seq: int = -1
    distilled: bool = False  # a teacher scored it (``TrajectoryGroup.distilled``)

    @classmethod
    def of(cls, group: TrajectoryGroup, frame: bytes) -> StoredGroup:
        """``frame`` must be ``group``'s msgpack encoding."""
        lo, hi = group.version_range()
        return cls(
            group.group_id,
            group.prompt_id,
            group.created_at,
            group.finished_at,
            lo,
            hi,
            group.num_tokens,
            group.nbytes,
            group.rewards,
            frame,
            group.weights_epoch,
            policy_tokens=group.policy_tokens,
            prompt_index=group.prompt_index,
            sender=group.sender,
            seq=group.seq,
            distilled=group.distilled,
        )


class GroupDecoder:
    """Frame -> ``StoredGroup``, or ``None`` (counted by kind, logged once) if malformed."""

    def __init__(self, name: str, vocab_size: int = 0) -> None:
        """``vocab_size``: token ids must be below it (0: not checked)."""
        self.codec: Codec[TrajectoryGroup] = Codec(TrajectoryGroup, name)
        self.vocab_size = vocab_size

    @property
    def malformed(self):
        return self.codec.malformed

    def decode(self, frame: bytes) -> StoredGroup | None:
        group = self.codec.decode(frame)
        if group is None:
            return None
        reason = group.check()
        if reason is not None:
            return self.reject("inconsistent_lengths", f"group {group.group_id!r}: {reason}")
        stored = StoredGroup.of(group, frame)
        if stored.min_version < 0 or stored.weights_epoch < 0:
            lowest = min(stored.min_version, stored.weights_epoch)
            detail = f"group {group.group_id!r}: negative version or epoch {lowest}"
            return self.reject("ValidationError", detail)
        mismatch = identity_error(group.group_id, group.sender, group.seq)
        if mismatch is not None:
            return self.reject("ValidationError", f"group {group.group_id!r}: {mismatch}")
        stored.refused = refusal(group, self.vocab_size) or ""
        return stored

    def reject(self, kind: str, detail: str) -> None:
        self.codec.count_malformed(kind, detail)


def refusal(group: TrajectoryGroup, vocab_size: int = 0) -> str | None:
    """Why a well-formed group must not reach a learner (a counted reason), or ``None``.
    Call after ``TrajectoryGroup.check`` passed (whole 4-byte elements)."""
    if group.unscored:  # its generator could not get its served scores (workers.generation.scoring)
        return "unscored"
    if not group.trajectories:
        return "no_trajectories"
    if all(not t.response_ids for t in group.trajectories):
        return "empty_responses"
    for t in group.trajectories:
        if not t.prompt_ids:
            return "empty_prompt"
        if not math.isfinite(t.reward):
            return "nonfinite_reward"
        if not (math.isfinite(t.temperature) and t.temperature > 0):
            return "bad_temperature"
        if t.behavior_logprobs and not all(map(math.isfinite, _view(t.behavior_logprobs, "f"))):
            return "nonfinite_logprob"
        for ids in (t.prompt_ids, t.response_ids):
            tokens = _view(ids, "i")
            if tokens and (min(tokens) < 0 or (vocab_size and max(tokens) >= vocab_size)):
                return "token_out_of_vocab"
    return None


def _view(data: bytes, fmt: str) -> memoryview:
    # Little-endian on the wire; every platform streamrl runs on is little-endian.
    return memoryview(data).cast(fmt)
