"""A generator's requests to a served reward role (a reward model, a judge, a teacher) and
its replies: the items to score and, per item, a score or the teacher's token logprobs."""

from __future__ import annotations

from typing import Annotated

import msgspec

from streamrl.protocol.trajectories import (
    MAX_SENDER_NAME,
)


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
