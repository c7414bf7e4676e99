"""``chain``: multi-term arithmetic, ``What is 23 + 8 - 14 + 6?``, ground truth ``23``.

``data.chain_terms`` operands in ``[0, data.max_operand]``, each operation from
``data.operations`` (``*`` binds first, as written); the answer is an integer, checked on
held-out questions by evaluation's ``first_line_answer`` and trained with ``numeric_match``
(plus ``number_only`` for form). The question's key for the held-out split is the
expression with its terms in a fixed order (``commuted_key``: ``23 + 8 - 14 + 6`` and
``8 + 6 - 14 + 23`` are one question, ``6+8+23-14``; a subtracted term stays subtracted).
"""

from __future__ import annotations

import random

from streamrl.config import DataConfig
from streamrl.tasks.base import Prompt, Task, commuted_key, draw, messages
from streamrl.tasks.expression import parse, value

SYSTEM_PROMPT = "Answer with the number only."


def chain_question(config: DataConfig, seed: int, index: int, split: str = "train") -> Prompt:
    """Question ``index`` of the seeded stream (from ``(seed, index)``) of ``split``."""
    rng = random.Random(f"chain:{seed}:{index}")

    def make(rng: random.Random) -> tuple[str, str]:
        terms = [str(rng.randint(0, config.max_operand)) for _ in range(config.chain_terms)]
        text = terms[0]
        for term in terms[1:]:
            text += f" {rng.choice(config.operations)} {term}"
        return commuted_key(text), text

    key, text = draw(rng, split, config.holdout_every, make)
    tree = parse(text)
    answer = value(tree) if tree is not None else None
    assert answer is not None and answer.denominator == 1, text  # + - * of integers
    return Prompt(
        f"chain-{index}",
        messages(SYSTEM_PROMPT, f"What is {text}?"),
        str(answer.numerator),
        "chain",
        key,
    )


TASK = Task("chain", chain_question)
