"""What a built-in task is made of: a prompt, the held-out rule, the draw of a question.

A task (``streamrl.tasks``) turns ``(seed, index, split)`` into a ``Prompt``: question
``index`` of a stream seeded by ``(seed, index)``, the same on every machine. The held-out
split is chosen by a hash of the question's *key* (what makes two questions the same, e.g.
``23+8-14+6``), one key in ``data.holdout_every``: ``split="train"`` never yields a held-out
key and ``split="eval"`` yields only those, so evaluation asks questions training never saw.

``Prompt`` and ``DataError`` live here, below ``streamrl.data`` (which re-exports them), so
that the tasks and the file reader build the same thing.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from streamrl.config import DataConfig


class DataError(ValueError):
    """Prompts that cannot be used (a bad file, a task that cannot draw); one-line message."""


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    messages: list[dict[str, str]]
    ground_truth: str
    data_source: str


def held_out(key: str, every: int) -> bool:
    """Whether the question ``key`` belongs to the evaluation split: one key in ``every``
    (0: none), by a hash of the key, the same on every machine."""
    return every > 0 and zlib.crc32(key.encode()) % every == 0


T = TypeVar("T")

# A question space so small that this many draws find no question of the split fails loudly
# instead of looping (e.g. every question held out, or none).
MAX_DRAWS = 100_000


def draw(
    rng: random.Random, split: str, every: int, make: Callable[[random.Random], tuple[str, T]]
) -> T:
    """``make(rng)`` -> (key, question) until the key falls in ``split`` (module doc)."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    if split == "eval" and every == 0:
        raise DataError("data.holdout_every is 0: no question is held out for evaluation")
    for _ in range(MAX_DRAWS):
        key, question = make(rng)
        if held_out(key, every) == (split == "eval"):
            return question
    raise DataError(
        f"no {split} question in {MAX_DRAWS} draws: the task's question space is too small "
        "for data.holdout_every (widen data.max_operand or the task's knobs)"
    )


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
