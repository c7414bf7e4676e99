"""What a built-in task is made of: a prompt, the held-out rule, the draw of a question.

A task (``streamrl.tasks``) turns ``(seed, index, split)`` into a ``Prompt``: question
``index`` of a stream seeded by ``(seed, index)``, the same on every machine. The held-out
split is chosen by a hash of the question's *key* (what makes two questions the same, e.g.
``6+8+23-14`` for ``23 + 8 - 14 + 6``: the same terms in another order are the same question;
``commuted_key``), one key in ``data.holdout_every``: ``split="train"`` never yields a
held-out key and ``split="eval"`` yields only those, so evaluation asks questions training
never saw. A prompt carries its key, so evaluation can ask each question once.

``Prompt`` and ``DataError`` live here, below ``streamrl.data`` (which re-exports them), so
that the tasks and the file reader build the same thing.
"""

from __future__ import annotations

import functools
import random
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from streamrl.config import DataConfig


class DataError(ValueError):
    """Prompts that cannot be used (a bad file, a task that cannot draw); one-line message."""


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    messages: list[dict[str, str]]
    ground_truth: str
    data_source: str
    # What makes two questions the same (the held-out key, module doc); "" for a file's row.
    key: str = ""
    # What a verifier needs beyond the ground truth (a reasoning-gym entry's metadata, a
    # file row's extra columns), JSON-like; rewards see it as ``RewardInput.metadata``.
    metadata: dict[str, Any] | None = None
    # A response that answers it well ("" = none): what ``algorithm.guidance`` trains on
    # where no sample scores as well (workers/generation/guidance.py). Arithmetic's worked
    # equation, countdown's building expression, a reasoning-gym entry's answer, a table's
    # ``data.reference_key``; chain, gsm and guess have none.
    reference: str = ""

    @property
    def question(self) -> str:
        """What the prompt asks: its last message (the user's), "" without messages. What
        rewards, served scorers and reward-model pairs are shown as the question."""
        return self.messages[-1]["content"] if self.messages else ""


def held_out(key: str, every: int) -> bool:
    """Whether the question ``key`` belongs to the evaluation split: one key in ``every``
    (0: none), by a hash of the key, the same on every machine."""
    return every > 0 and zlib.crc32(key.encode()) % every == 0


_TERM = re.compile(r"([+-]?)([^+-]+)")


def commuted_key(expression: str) -> str:
    """The key of a chain of integers with ``+ - *`` (no brackets, ``*`` first): the same for
    every order of its terms that keeps its value by commuting, and for every order of a
    product's factors; a term keeps its sign. ``b+a`` -> ``a+b``; ``23+8-14+6`` ->
    ``6+8+23-14`` (terms added, ascending, then those subtracted); ``4+3*2`` -> ``2*3+4``;
    ``7-3`` stays ``7-3`` and ``3-7`` is another question. Spaces are ignored.

    Example: ``commuted_key("8 - 14 + 23 + 6") == commuted_key("23+8-14+6") == "6+8+23-14"``.
    """
    terms = [
        (sign == "-", sorted(int(f) for f in body.split("*")))
        for sign, body in _TERM.findall(expression.replace(" ", ""))
    ]
    terms.sort()  # added before subtracted; each side by its factors, ascending
    text = "".join(("-" if minus else "+") + "*".join(map(str, f)) for minus, f in terms)
    return text.removeprefix("+")


T = TypeVar("T")

# A question space so small that this many draws find no question of the split fails loudly
# instead of looping (e.g. every question held out, or none).
MAX_DRAWS = 100_000


def draw(
    rng: random.Random, split: str, every: int, make: Callable[[random.Random], tuple[str, T]]
) -> tuple[str, T]:
    """``make(rng)`` -> (key, question) until the key falls in ``split`` (module doc); the
    first such (key, question)."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    if split == "eval" and every == 0:
        raise DataError("data.holdout_every is 0: no question is held out for evaluation")
    for _ in range(MAX_DRAWS):
        key, question = make(rng)
        if held_out(key, every) == (split == "eval"):
            return key, question
    raise DataError(
        f"no {split} question in {MAX_DRAWS} draws: the task's question space is too small "
        "for data.holdout_every (widen data.args.max_operand or the task's other knobs)"
    )


class TaskArgs(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A task's knobs (``data.args``); a subclass checks its values in ``__post_init__``
    (raising ``ValueError`` with a one-line message)."""


A = TypeVar("A", bound=TaskArgs)


@functools.lru_cache(maxsize=64)
def _decode_args(kind: type[A], encoded: bytes) -> A:
    return msgspec.json.decode(encoded, type=kind)


def task_args(data: DataConfig, kind: type[A]) -> A:
    """``data.args`` as the task's typed knobs (decoded once per distinct value: a question is
    drawn per prompt); ``DataError`` naming the bad key."""
    try:
        return _decode_args(kind, msgspec.json.encode(data.args))
    except msgspec.ValidationError as exc:
        message = str(exc)
        unknown = re.match(r"Object contains unknown field `([^`]+)`", message)
        if unknown:
            known = ", ".join(kind.__struct_fields__) or "none"
            message = f"unknown key `{unknown.group(1)}` (this task's: {known})"
        raise DataError(f"data.args for {data.source}: {message.replace('`$.', '`')}") from None


def system_prompt(data: DataConfig, default: str) -> str:
    """The system prompt of a task's question: ``data.system_prompt`` when set, else the
    task's own ``default``."""
    return default if data.system_prompt is None else data.system_prompt


def messages(system: str, user: str) -> list[dict[str, str]]:
    """Chat messages: the system prompt (none if empty), then the question."""
    return ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": user}
    ]


@dataclass(frozen=True)
class Task:
    """A built-in task: ``question(data, seed, index, split)`` is its prompt ``index``;
    ``exact(response, ground_truth)`` is the held-out exact check of ``streamrl.evaluation``
    (None: evaluation's ``first_line_answer``, the number the first line states)."""

    name: str
    question: Callable[[DataConfig, int, int, str], Prompt]
    exact: Callable[[str, str], bool] | None = None
    args: type[TaskArgs] = TaskArgs
