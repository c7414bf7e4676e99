"""``arithmetic``: ``What is 7 + 12?``, ground truth ``19`` (the default job's task).

Operands in ``[0, data.max_operand]``, the operation from ``data.operations``; the wording is
configurable (``data.question_template(s)``, ``data.system_prompt``,
``data.no_system_prompt_share``) and the held-out exact check is evaluation's
``first_line_answer``.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

from streamrl.config import DataConfig
from streamrl.tasks.base import Prompt, Task, commuted_key, draw, held_out, messages


def question_key(a: int, op: str, b: int) -> str:
    """What ``a op b`` asks: ``b + a`` and ``b * a`` are ``a + b`` and ``a * b``; ``b - a`` is
    another question (``commuted_key``)."""
    return commuted_key(f"{a}{op}{b}")


def is_held_out(a: int, op: str, b: int, every: int) -> bool:
    """Whether the question ``a op b`` belongs to the evaluation split: one question in
    ``every`` (0: none), chosen by a hash of its key (``question_key``: ``a + b`` and
    ``b + a`` share a split), the same on every machine."""
    return held_out(question_key(a, op, b), every)


def arithmetic_question(
    config: DataConfig,
    seed: int,
    index: int,
    split: str = "train",
    phrasing: tuple[str, str] | None = None,
) -> Prompt:
    """Question ``index`` of the seeded stream, e.g. ``What is 7 + 12?`` with ground truth
    ``19``. ``split="train"`` never yields a held-out question (``data.holdout_every``) and
    ``split="eval"`` yields only those, so evaluation measures questions training never saw.

    Wording: a training question draws its template from ``data.question_template`` and
    ``data.question_templates`` and drops the system prompt with probability
    ``data.no_system_prompt_share`` (both from the question's own seed, after its numbers,
    so the numbers do not depend on the wordings); an eval question keeps
    ``question_template`` with the system prompt. ``phrasing``: (template, system prompt;
    "" for none) instead, for the same question."""
    rng = random.Random(f"{seed}:{index}")

    def make(rng: random.Random) -> tuple[str, tuple[int, str, int]]:
        a, b = rng.randint(0, config.max_operand), rng.randint(0, config.max_operand)
        op = rng.choice(config.operations)
        return question_key(a, op, b), (a, op, b)

    key, (a, op, b) = draw(rng, split, config.holdout_every, make)
    answer = {"+": a + b, "-": a - b, "*": a * b}[op]
    template, system = config.question_template, config.system_prompt
    if split == "train" and config.question_templates:
        template = rng.choice([config.question_template, *config.question_templates])
    if split == "train" and config.no_system_prompt_share > 0:
        system = "" if rng.random() < config.no_system_prompt_share else system
    template, system = phrasing or (template, system)
    user = template.format(a=a, op=op, b=b)
    return Prompt(f"arith-{index}", messages(system, user), str(answer), "arithmetic", key)


def arithmetic_prompts(
    config: DataConfig,
    seed: int,
    stream: int,
    streams: int,
    split: str = "train",
    phrasing: tuple[str, str] | None = None,
) -> Iterator[Prompt]:
    """Questions ``stream``, ``stream + streams``, ... of the seeded stream."""
    for index in itertools.count(stream, streams):
        yield arithmetic_question(config, seed, index, split, phrasing)


TASK = Task("arithmetic", arithmetic_question)
