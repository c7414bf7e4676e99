"""``guess``: find a hidden whole number with feedback each turn.

Each turn the policy names a number (the first thing in its turn); the environment answers
"Higher." or "Lower." until the guess is right (reward 1, success) or ``env.max_turns`` runs
out (finish reason ``turns``). A turn that does not start with a number gets "Reply with one
whole number." and costs the turn. ``consistent`` (default 0.1) is paid for each guess that
the feedback so far allows (inside the range still open), so a policy is paid for using the
feedback before it wins; a win always pays more than any lost game (1 against at most
``consistent * max_turns``). Guessing at random wins about ``max_turns / top`` of the games;
halving the open range every turn wins every game whose range is at most ``2^max_turns - 1``.

Prompts come from the ``guess`` task (``streamrl.tasks.guess``): the prompt's ground truth
is ``"<top>:<number>"``.
"""

from __future__ import annotations

import re

from streamrl.envs.base import Environment, StepResult
from streamrl.tasks.base import Prompt
from streamrl.tasks.guess import QUESTION

_LEADING_NUMBER = re.compile(r"\s*(-?\d+)\b")


# One game played well, shown before every question (``Environment.examples``).
EXAMPLE = (
    {"role": "user", "content": QUESTION.format(top=8)},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "Higher."},
    {"role": "assistant", "content": "6"},
    {"role": "user", "content": "Lower."},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": "Yes, 5 it is! New game."},
)


class GuessNumber(Environment):
    def __init__(self, consistent: float = 0.1, example: bool = True) -> None:
        self.consistent = consistent
        self.examples = EXAMPLE if example else ()
        self.secret = self.low = self.high = 0

    def reset(self, prompt: Prompt) -> None:
        top, _, secret = prompt.ground_truth.partition(":")
        self.secret, self.low, self.high = int(secret), 1, int(top)

    def step(self, text: str) -> StepResult:
        match = _LEADING_NUMBER.match(text)
        if match is None:
            return StepResult(observation="Reply with one whole number.", counts={"no_number": 1})
        guess = int(match.group(1))
        counts = {"guesses": 1.0, "consistent": float(self.low <= guess <= self.high)}
        reward = self.consistent * counts["consistent"]
        if guess == self.secret:
            return StepResult(reward=1.0 + reward, done=True, success=True, counts=counts)
        if guess < self.secret:
            self.low = max(self.low, guess + 1)
            return StepResult(observation="Higher.", reward=reward, counts=counts)
        self.high = min(self.high, guess - 1)
        return StepResult(observation="Lower.", reward=reward, counts=counts)
