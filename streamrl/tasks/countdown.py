"""``countdown``: reach a target from given numbers, each used at most once.

Question: ``Use the numbers 7, 3, 25 to make 46. ...``; the answer is the expression alone on
the first line, e.g. ``(25 - 3) * 2`` (a trailing ``= 46`` is allowed). The instance is built
from its numbers (``numbers`` of them in ``[1, max_operand]``; ``data.args``,
``CountdownArgs``) by combining all of them with random ``+ - * /`` steps whose every
intermediate result is a positive integer, so it is solvable; the target is in
``[1, max_target]`` and
not one of the numbers (a fixed number of tries, then the sum of the numbers).

Ground truth: JSON ``{"target": 46, "numbers": [7, 3, 25], "solution": "(25 - 3) * 2"}``
(the target and numbers as verl's countdown keeps them; ``solution`` is one way, for the
record). ``grade`` reads the answer with ``streamrl.tasks.expression`` (no ``eval``): the
numbers it uses must be a sub-multiset of the given ones and its value must equal the target
exactly. Anything malformed grades as wrong, never raises. The held-out key is the sorted
numbers and the target, so the same puzzle in another order is in the same split.

Why beside reasoning-gym's ``countdown`` (``configs/countdown_gym.yaml``), which asks for all
the numbers: here each number is used at most once, the expression is read without ``eval``
(reasoning-gym's verifier parses with sympy), and no package is needed.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

from streamrl.config import DataConfig
from streamrl.tasks.base import Prompt, Task, TaskArgs, draw, messages, system_prompt, task_args
from streamrl.tasks.expression import numbers as literals
from streamrl.tasks.expression import parse, value

SYSTEM_PROMPT = "Answer with the expression only."
QUESTION = (
    "Use the numbers {numbers} to make {target}. You may use + - * / and parentheses, and "
    "each number at most once."
)
_TRIES = 100


class CountdownArgs(TaskArgs):
    max_operand: int = 20  # the largest number given
    numbers: int = 3  # numbers given per puzzle
    max_target: int = 100

    def __post_init__(self) -> None:
        if self.max_operand < 1:
            raise ValueError("max_operand must be >= 1")
        if not 2 <= self.numbers <= 6:
            raise ValueError("numbers must be in [2, 6]")
        if self.max_target < 1:
            raise ValueError("max_target must be >= 1")


def _combine(rng: random.Random, numbers: list[int]) -> tuple[int, str]:
    """Combine all of ``numbers`` by random steps (module doc): (value, expression)."""
    pool = [(n, str(n)) for n in numbers]
    while len(pool) > 1:
        i, j = rng.sample(range(len(pool)), 2)
        (a, ta), (b, tb) = pool[i], pool[j]
        if a < b:
            (a, ta), (b, tb) = (b, tb), (a, ta)
        steps = [(a + b, f"{ta} + {tb}"), (a * b, f"{ta} * {tb}")]
        if a > b:
            steps.append((a - b, f"{ta} - {tb}"))
        if b > 1 and a % b == 0:
            steps.append((a // b, f"{ta} / {tb}"))
        result, text = rng.choice(steps)
        pool = [p for k, p in enumerate(pool) if k not in (i, j)] + [(result, f"({text})")]
    result, text = pool[0]
    return result, text[1:-1] if text.startswith("(") else text


def countdown_question(config: DataConfig, seed: int, index: int, split: str = "train") -> Prompt:
    """Puzzle ``index`` of the seeded stream (from ``(seed, index)``) of ``split``."""
    args = task_args(config, CountdownArgs)
    rng = random.Random(f"countdown:{seed}:{index}")

    def make(rng: random.Random) -> tuple[str, tuple[list[int], int, str]]:
        for _ in range(_TRIES):
            given = [rng.randint(1, args.max_operand) for _ in range(args.numbers)]
            target, solution = _combine(rng, given)
            if target <= args.max_target and target not in given:
                break
        else:  # a cramped setting: still solvable, perhaps above the target range
            target, solution = sum(given), " + ".join(map(str, given))
        return f"{sorted(given)}:{target}", (given, target, solution)

    key, (given, target, solution) = draw(rng, split, config.holdout_every, make)
    truth = json.dumps({"target": target, "numbers": given, "solution": solution})
    user = QUESTION.format(numbers=", ".join(map(str, given)), target=target)
    return Prompt(
        f"countdown-{index}",
        messages(system_prompt(config, SYSTEM_PROMPT), user),
        truth,
        "countdown",
        key,
        reference=solution,  # the expression the puzzle was built from
    )


def puzzle(ground_truth: str) -> tuple[int, list[int]] | None:
    """(target, numbers) of a ground truth (module doc), or None if it is not one."""
    try:
        truth: Any = json.loads(ground_truth)
        target, given = truth["target"], truth["numbers"]
    except (ValueError, TypeError, KeyError):
        return None
    if type(target) is not int or not isinstance(given, list):
        return None
    if not all(type(n) is int for n in given):
        return None
    return target, given


def answer_line(response: str) -> str:
    """The answer's expression: the first non-empty line, without a trailing ``= ...`` or
    period, with ``×``/``÷``/``−`` read as ``*``/``/``/``-``."""
    line = next((part.strip() for part in response.splitlines() if part.strip()), "")
    line = line.split("=", 1)[0].strip().rstrip(".").strip()
    return line.translate(str.maketrans({"×": "*", "÷": "/", "−": "-"}))


def grade(response: str, ground_truth: str) -> tuple[bool, bool]:
    """(legal, solved): ``legal`` if the answer is a well-formed expression of at least two
    of the given numbers, each used at most once; ``solved`` if it also equals the target."""
    game, tree = puzzle(ground_truth), parse(answer_line(response))
    if game is None or tree is None:
        return False, False
    target, given = game
    used = literals(tree)
    legal = len(used) >= 2 and Counter(used) <= Counter(given)
    return legal, legal and value(tree) == target


def solves(response: str, ground_truth: str) -> bool:
    """The held-out exact check: the answer reaches the target by the rules."""
    return grade(response, ground_truth)[1]


TASK = Task("countdown", countdown_question, exact=solves, args=CountdownArgs)
