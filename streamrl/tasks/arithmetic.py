"""``arithmetic``: ``What is 7 + 12?``, ground truth ``19`` (the default job's task).

Knobs (``data.args``, ``ArithmeticArgs``): operands in ``[0, max_operand]``, the operation
from ``operations``, and the wording (``question_template(s)``, ``no_system_prompt_share``;
the system prompt is ``data.system_prompt``, by default ``SYSTEM_PROMPT``). The held-out exact
check is evaluation's ``first_line_answer``.

Why beside reasoning-gym's ``basic_arithmetic``: several wordings per question with and
without the system prompt (and an unseen one for evaluation), and a held-out key under which
``b + a`` is ``a + b``: the default job measures arithmetic, not one prompt's format.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Literal

import msgspec

from streamrl.config import DataConfig, format_fields
from streamrl.tasks.base import (
    Prompt,
    Task,
    TaskArgs,
    commuted_key,
    draw,
    held_out,
    messages,
    system_prompt,
    task_args,
)

SYSTEM_PROMPT = "Answer with the number only."


class ArithmeticArgs(TaskArgs):
    max_operand: int = 20
    operations: list[Literal["+", "-", "*"]] = msgspec.field(default_factory=lambda: ["+", "-"])
    # The user message; `{a}`, `{op}` and `{b}` are filled in.
    question_template: str = "What is {a} {op} {b}?"
    # More wordings for training: each training question is worded by one of
    # [question_template, *question_templates], drawn from its seed, and asked without the
    # system prompt with probability `no_system_prompt_share`, so that a run learns the task
    # rather than one prompt's answer format. Evaluation keeps question_template with the
    # system prompt, and asks eval.unseen_phrasing (never trained on) beside it.
    question_templates: list[str] = msgspec.field(default_factory=list)
    no_system_prompt_share: float = 0.0

    def __post_init__(self) -> None:
        if self.max_operand < 1:
            raise ValueError("max_operand must be >= 1")
        if not self.operations:
            raise ValueError("operations must name at least one operation")
        for template in (self.question_template, *self.question_templates):
            if format_fields(template) != {"a", "op", "b"}:
                raise ValueError(
                    f"question template {template!r} must use exactly the fields {{a}}, "
                    "{op} and {b}"
                )
        if not 0.0 <= self.no_system_prompt_share <= 1.0:
            raise ValueError("no_system_prompt_share must be in [0, 1]")


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

    Wording: a training question draws its template from ``question_template`` and
    ``question_templates`` and drops the system prompt with probability
    ``no_system_prompt_share`` (both from the question's own seed, after its numbers, so the
    numbers do not depend on the wordings); an eval question keeps ``question_template``
    with the system prompt. ``phrasing``: (template, system prompt; "" for none) instead,
    for the same question."""
    args = task_args(config, ArithmeticArgs)
    rng = random.Random(f"{seed}:{index}")

    def make(rng: random.Random) -> tuple[str, tuple[int, str, int]]:
        a, b = rng.randint(0, args.max_operand), rng.randint(0, args.max_operand)
        op = rng.choice(args.operations)
        return question_key(a, op, b), (a, op, b)

    key, (a, op, b) = draw(rng, split, config.holdout_every, make)
    answer = {"+": a + b, "-": a - b, "*": a * b}[op]
    template, system = args.question_template, system_prompt(config, SYSTEM_PROMPT)
    if split == "train" and args.question_templates:
        template = rng.choice([args.question_template, *args.question_templates])
    if split == "train" and args.no_system_prompt_share > 0:
        system = "" if rng.random() < args.no_system_prompt_share else system
    template, system = phrasing or (template, system)
    user = template.format(a=a, op=op, b=b)
    # The reference restates the question as an equation, the form the rewards pay.
    reference = f"{a} {op} {b} = {answer}"
    return Prompt(
        f"arith-{index}",
        messages(system, user),
        str(answer),
        "arithmetic",
        key,
        reference=reference,
    )


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


TASK = Task("arithmetic", arithmetic_question, args=ArithmeticArgs)
