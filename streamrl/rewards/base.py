"""What a reward is: a function of a ``RewardInput`` (and keyword arguments from its
``rewards:`` entry) that returns a float; the registry of named ones (``REWARDS``, filled by
``register``) and ``resolve_reward``, which also loads a user's ``module:function`` or
``python:<name>`` (``streamrl.plugins``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streamrl.config import ConfigError
from streamrl.plugins import load_named


@dataclass(frozen=True)
class RewardInput:
    response_text: str
    response_ids: list[int]
    ground_truth: str
    data_source: str = ""
    # The question (the prompt's last user message); "" when the caller does not pass it.
    prompt_text: str = ""
    # "stop" (the model ended it), "length" (cut at the token limit) or "abort"; "" unknown.
    finish_reason: str = ""
    # The prompt's ``metadata`` (e.g. a reasoning-gym entry's, which its verifier reads).
    metadata: dict[str, Any] | None = None

    @classmethod
    def of(
        cls, prompt: Any, text: str, response_ids: list[int], finish_reason: str = ""
    ) -> RewardInput:
        """What a reward sees of one response to ``prompt`` (a ``data.Prompt``): training and
        evaluation build it here alike, the question included (``equation_form`` reads it)."""
        return cls(
            text,
            response_ids,
            prompt.ground_truth,
            prompt.data_source,
            prompt.question,
            finish_reason=finish_reason,
            metadata=getattr(prompt, "metadata", None),
        )


RewardFn = Callable[..., float]
REWARDS: dict[str, RewardFn] = {}


def register(name: str) -> Callable[[RewardFn], RewardFn]:
    def wrap(fn: RewardFn) -> RewardFn:
        REWARDS[name] = fn
        return fn

    return wrap


def resolve_reward(name: str) -> RewardFn:
    if name in REWARDS:
        return REWARDS[name]
    if ":" in name:
        fn = load_named(name, "reward")
        if not callable(fn):
            raise ConfigError(f"reward {name!r} is not callable")
        return fn
    raise ConfigError(f"unknown reward {name!r}: use one of {sorted(REWARDS)} or module:function")
