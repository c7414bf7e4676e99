"""What a served scorer (a reward model or a judge, docs/design.md §7c) is given and gives.

A scorer takes a batch of ``ScoreItem``s (the question, the response, the reference answer)
and returns one float per item, or None where it could not score that item (a judge's
unparsable verdict): the caller counts those and never reads them as 0. Its ``identity``
(``"<label>@<weights hash>"``) travels with every score, so a trajectory says which weights
scored it.

Stdlib only: the generator's scoring client and the controller import this without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ScoreItem:
    prompt: str  # the question: the prompt's last user message
    response: str
    ground_truth: str = ""
    # For a teacher: the tokens as sampled (little-endian int32) and their temperature.
    prompt_ids: bytes = b""
    response_ids: bytes = b""
    temperature: float = 1.0
    # False: the response was cut at the token limit, not ended by the model (a reward
    # model scores it without an end-of-turn marker: ``streamrl.rewards.model.reward_text``).
    stopped: bool = True


class Scorer(Protocol):
    identity: str

    def score(self, items: list[ScoreItem]) -> list[float | None]: ...


@dataclass(frozen=True)
class TokenAnswer:
    """A teacher's answer for one item: float32 logprobs of its response tokens, and with
    ``top_k`` its k likeliest tokens per position (int32 ids, float32 logprobs; else empty)."""

    logprobs: bytes
    top_ids: bytes = b""
    top_logprobs: bytes = b""


class TokenScorer(Protocol):
    """A teacher: a ``TokenAnswer`` per item. A lagged copy of the student
    (``workers.reward_roles.lagged_teacher``) also has ``follow(version, epoch)`` (a
    request's clock), ``tend()`` (between batches: move its weights) and ``version`` (the
    student's version it scores with, sent with every answer); the reward role calls them
    where they exist."""

    identity: str
    per_token: bool  # True

    def score(self, items: list[ScoreItem]) -> list[TokenAnswer]: ...


def scorer_identity(label: str, weights_hash: str) -> str:
    """``"rm-smol@3f9a1c2b7d01"``: the scorer's name and the hash of the weights it serves."""
    return f"{label}@{weights_hash}"
