"""``gsm``: GSM8K-style word problems from templates, two or three steps, integer answers.

Each template draws its quantities (the held-out key is the template's name and its
quantities, so a held-out problem differs from every training one in more than its names),
then names, pronouns and items from the same seed. The expected answer is a worked solution
ending in ``#### N`` (GSM8K's form); the ground truth is ``N``. Training uses the ``gsm8k``
reward (its ``format_score`` for a ``####`` answer that is wrong); the held-out exact check,
``final_answer``, reads the number after the first ``####`` as ``gsm8k`` does, in code of
its own.

Example: ``Ava buys 4 pens that cost $3 each. She pays with a $20 bill. How much change does
Ava get?``, ground truth ``8``.

Why beside reasoning-gym's ``gsm_symbolic``: its held-out key leaves out the names, so a
held-out problem is a new problem and not a training problem renamed; the problems are one to
three steps, within reach of a 135M model; and no package is needed.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from fractions import Fraction

from streamrl.config import DataConfig
from streamrl.tasks.base import Prompt, Task, draw, messages, system_prompt

SYSTEM_PROMPT = (
    "Solve the problem step by step. End with the final answer on its own line as #### <number>."
)
NAMES = [
    ("Ava", "she"),
    ("Liam", "he"),
    ("Maya", "she"),
    ("Noah", "he"),
    ("Zoe", "she"),
    ("Omar", "he"),
    ("Lena", "she"),
    ("Ravi", "he"),
    ("Sofia", "she"),
    ("Ken", "he"),
]
ITEMS = {
    "goods": ["pens", "notebooks", "tickets", "mugs", "candles", "apples"],
    "things": ["marbles", "stamps", "shells", "cards", "beads"],
    "food": ["cookies", "muffins", "cupcakes", "rolls"],
    "vehicle": ["train", "bus", "car", "truck"],
    "purchase": ["bike", "game", "jacket", "lamp", "backpack"],
}

# A template: (quantities drawn from rng or None to draw again, the question with fields for
# quantities q0, q1, ... and for names and items, the answer of the quantities).
Template = tuple[Callable[[random.Random], tuple[int, ...] | None], str, Callable[..., int]]


def _change(rng: random.Random) -> tuple[int, ...]:
    n, price = rng.randint(2, 9), rng.randint(2, 15)
    bill = next(b for b in (20, 50, 100, 200) if b > n * price)
    return n, price, bill


def _bags(rng: random.Random) -> tuple[int, ...]:
    a, b, c = rng.randint(2, 30), rng.randint(2, 6), rng.randint(3, 12)
    return a, b, c, rng.randint(1, a + b * c - 1)


def _share(rng: random.Random) -> tuple[int, ...] | None:
    a, b = rng.randint(2, 8), rng.randint(4, 12)
    friends = [c for c in range(2, 11) if (a * b) % c == 0 and c != a and c != b]
    return (a, b, rng.choice(friends)) if friends else None


def _stickers(rng: random.Random) -> tuple[int, ...]:
    a, m = rng.randint(3, 20), rng.randint(2, 5)
    return a, m, rng.randint(1, a * m - 1)


def _savings(rng: random.Random) -> tuple[int, ...]:
    a, w = rng.randint(5, 30), rng.randint(3, 12)
    return a, w, rng.randint(1, a * w - 1)


TEMPLATES: dict[str, Template] = {
    "change": (
        _change,
        "{name} buys {q0} {goods} that cost ${q1} each. {Pronoun} pays with a ${q2} bill. "
        "How much change does {name} get?",
        lambda n, price, bill: bill - n * price,
    ),
    "bags": (
        _bags,
        "{name} has {q0} {things}. {Pronoun} buys {q1} bags with {q2} {things} in each bag, "
        "then gives {q3} {things} to {friend}. How many {things} does {name} have now?",
        lambda a, b, c, d: a + b * c - d,
    ),
    "wage": (
        lambda rng: (rng.randint(8, 25), rng.randint(2, 9), rng.randint(2, 9)),
        "{name} earns ${q0} per hour. {Pronoun} works {q1} hours on Monday and {q2} hours on "
        "Tuesday. How many dollars does {name} earn on the two days?",
        lambda rate, h, k: rate * (h + k),
    ),
    "share": (
        _share,
        "{name} bakes {q0} trays of {food} with {q1} {food} on each tray. {Pronoun} shares "
        "them equally among {q2} friends. How many {food} does each friend get?",
        lambda a, b, c: a * b // c,
    ),
    "trip": (
        lambda rng: tuple(rng.randint(lo, hi) for lo, hi in ((4, 18), (2, 6), (4, 18), (2, 6))),
        "A {vehicle} travels at {s} km per hour for {q1} hours, then at {t} km per hour for "
        "{q3} hours. How many km does it travel in all?",
        lambda s, h, t, k: 5 * s * h + 5 * t * k,
    ),
    "stickers": (
        _stickers,
        "{name} has {q0} {things}. {friend} has {q1} times as many {things} as {name}, and "
        "{other} has {q2} fewer {things} than {friend}. How many {things} do the three of "
        "them have together?",
        lambda a, m, d: a + a * m + (a * m - d),
    ),
    "savings": (
        _savings,
        "{name} saves ${q0} every week for {q1} weeks. Then {pronoun} spends ${q2} on a "
        "{purchase}. How many dollars does {name} have left?",
        lambda a, w, b: a * w - b,
    ),
}


def gsm_question(config: DataConfig, seed: int, index: int, split: str = "train") -> Prompt:
    """Problem ``index`` of the seeded stream (from ``(seed, index)``) of ``split``."""
    rng = random.Random(f"gsm:{seed}:{index}")

    def make(rng: random.Random) -> tuple[str, tuple[str, tuple[int, ...]]]:
        while True:  # _share's rare dead end: every branch terminates within a few draws
            name = rng.choice(sorted(TEMPLATES))
            quantities = TEMPLATES[name][0](rng)
            if quantities is not None:
                return f"{name}:{quantities}", (name, quantities)

    key, (name, quantities) = draw(rng, split, config.holdout_every, make)
    _, text, answer = TEMPLATES[name]
    (person, pronoun), (friend, _), (other, _) = rng.sample(NAMES, 3)
    fields = {f"q{i}": q for i, q in enumerate(quantities)}
    fields |= {kind: rng.choice(choices) for kind, choices in ITEMS.items()}
    if name == "trip":  # speeds are multiples of 5
        fields |= {"s": 5 * quantities[0], "t": 5 * quantities[2]}
    user = text.format(
        name=person,
        pronoun=pronoun,
        Pronoun=pronoun.capitalize(),
        friend=friend,
        other=other,
        **fields,
    )
    truth = str(answer(*quantities))
    system = system_prompt(config, SYSTEM_PROMPT)
    return Prompt(f"gsm-{index}", messages(system, user), truth, "gsm", key)


_FINAL = re.compile(r"####\s*(-?[\d,]*\d(?:\.\d+)?)")


def final_answer(response: str, ground_truth: str) -> bool:
    """The held-out exact check: the number after the response's first ``####`` (commas
    allowed) equals the ground truth (``N`` or a solution ending in ``#### N``)."""
    match = _FINAL.search(response)
    truth = _FINAL.search(ground_truth) or re.fullmatch(
        r"\s*(-?[\d,]*\d(?:\.\d+)?)\s*", ground_truth
    )
    if match is None or truth is None:
        return False
    return Fraction(match.group(1).replace(",", "")) == Fraction(truth.group(1).replace(",", ""))


TASK = Task("gsm", gsm_question, exact=final_answer)
