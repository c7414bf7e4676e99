"""``chain``: multi-term arithmetic, ``What is 23 + 8 - 14 + 6?``, ground truth ``23``.

``terms`` operands in ``[0, max_operand]`` (``data.args``, ``ChainArgs``), each operation
from ``operations`` (``*`` binds first, as written); the answer is an integer, checked on
held-out questions by evaluation's ``first_line_answer`` and trained with ``numeric_match``
(plus ``number_only`` for form). The question's key for the held-out split is the
expression with its terms in a fixed order (``commuted_key``: ``23 + 8 - 14 + 6`` and
``8 + 6 - 14 + 23`` are one question, ``6+8+23-14``; a subtracted term stays subtracted).

Why beside reasoning-gym's ``chain_sum``: the commuted held-out key (a reordered training
question is not held out) and operands small enough for a 135M model; the calculator
environment plays these questions.
"""

from __future__ import annotations

import random
from typing import Literal

import msgspec

from streamrl.config import DataConfig
from streamrl.tasks.base import (
    Prompt,
    Task,
    TaskArgs,
    commuted_key,
    draw,
    messages,
    system_prompt,
    task_args,
)
from streamrl.tasks.expression import parse, value

SYSTEM_PROMPT = "Answer with the number only."


class ChainArgs(TaskArgs):
    max_operand: int = 20
    operations: list[Literal["+", "-", "*"]] = msgspec.field(default_factory=lambda: ["+", "-"])
    terms: int = 4  # operands per question

    def __post_init__(self) -> None:
        if self.max_operand < 1:
            raise ValueError("max_operand must be >= 1")
        if not self.operations:
            raise ValueError("operations must name at least one operation")
        if not 2 <= self.terms <= 12:
            raise ValueError("terms must be in [2, 12]")


def chain_question(config: DataConfig, seed: int, index: int, split: str = "train") -> Prompt:
    """Question ``index`` of the seeded stream (from ``(seed, index)``) of ``split``."""
    args = task_args(config, ChainArgs)
    rng = random.Random(f"chain:{seed}:{index}")

    def make(rng: random.Random) -> tuple[str, str]:
        terms = [str(rng.randint(0, args.max_operand)) for _ in range(args.terms)]
        text = terms[0]
        for term in terms[1:]:
            text += f" {rng.choice(args.operations)} {term}"
        return commuted_key(text), text

    key, text = draw(rng, split, config.holdout_every, make)
    tree = parse(text)
    answer = value(tree) if tree is not None else None
    assert answer is not None and answer.denominator == 1, text  # + - * of integers
    return Prompt(
        f"chain-{index}",
        messages(system_prompt(config, SYSTEM_PROMPT), f"What is {text}?"),
        str(answer.numerator),
        "chain",
        key,
    )


TASK = Task("chain", chain_question, args=ChainArgs)
