"""``guess``: the guessing game's prompts (``streamrl.envs.guess`` plays it).

"I am thinking of a whole number from 1 to 12. ..." with the range's top drawn from
``[4, max_operand]`` (``data.args``) and the hidden number from ``[1, top]``; ground
truth ``"12:7"``. The held-out key is the pair (``12:7``). Single-turn evaluation has no
meaning here (``exact`` is False): the environment's success rate is the figure.
"""

from __future__ import annotations

import random

from streamrl.config import DataConfig
from streamrl.tasks.base import Prompt, Task, TaskArgs, draw, messages, system_prompt, task_args

SYSTEM_PROMPT = "You are playing a guessing game. Reply with one whole number and nothing else."
QUESTION = (
    "I am thinking of a whole number from 1 to {top}. Guess it! After each guess I will say "
    '"Higher." or "Lower.".'
)
MIN_TOP = 4  # the smallest range drawn (or max_operand, if smaller)


class GuessArgs(TaskArgs):
    max_operand: int = 20  # the largest range's top

    def __post_init__(self) -> None:
        if self.max_operand < 1:
            raise ValueError("max_operand must be >= 1")


def guess_question(config: DataConfig, seed: int, index: int, split: str = "train") -> Prompt:
    args = task_args(config, GuessArgs)
    rng = random.Random(f"guess:{seed}:{index}")

    def make(rng: random.Random) -> tuple[str, tuple[int, int]]:
        top = rng.randint(min(MIN_TOP, args.max_operand), args.max_operand)
        secret = rng.randint(1, top)
        return f"{top}:{secret}", (top, secret)

    key, (top, secret) = draw(rng, split, config.holdout_every, make)
    return Prompt(
        f"guess-{index}",
        messages(system_prompt(config, SYSTEM_PROMPT), QUESTION.format(top=top)),
        f"{top}:{secret}",
        "guess",
        key,
    )


TASK = Task("guess", guess_question, exact=lambda response, truth: False, args=GuessArgs)
