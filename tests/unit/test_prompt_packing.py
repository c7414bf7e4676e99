"""``batching._packed``: prompts that begin alike share rows, never at a higher estimated cost
than a row per prompt, and every prompt lands in exactly one row."""

from __future__ import annotations

import random

import pytest

from streamrl.workers.learning.batching import _common, _cost, _Family, _packed, _Row


def _families(count: int, seed: int) -> list[_Family]:
    """Chat-like prompts: most begin with the same 24-token system prompt, some with 3."""
    rng = random.Random(seed)
    system = list(range(1000, 1024))
    families = []
    for n in range(count):
        body = [rng.randrange(2000, 3000) for _ in range(rng.randrange(5, 21))]
        head = system if rng.random() < 0.8 else system[:3]
        families.append(_Family(head + body, [n], rng.randrange(1, 100)))
    return families


def _row_cost(rows: list[_Row], hidden: int) -> float:
    return _cost(len(rows), max(r.width for r in rows), hidden)


@pytest.mark.parametrize("count", [1, 2, 8, 40, 300])
@pytest.mark.parametrize("hidden", [64, 576, 4096])
def test_packing_costs_no_more_than_a_row_per_prompt(count: int, hidden: int) -> None:
    families = _families(count, seed=count + hidden)
    rows = _packed(families, hidden)
    alone = [_Row([f], len(f.prompt)) for f in families]
    assert _row_cost(rows, hidden) <= _row_cost(alone, hidden)
    placed = sorted(i for r in rows for f in r.families for i in f.members)
    assert placed == list(range(count))
    for row in rows:  # the shared tokens are alike in every prompt of the row
        first = row.families[0].prompt
        assert all(_common(first, f.prompt) >= row.shared for f in row.families)
        assert all(len(f.prompt) >= row.shared for f in row.families)


def test_a_chat_template_s_system_prompt_is_held_once_per_row() -> None:
    """Eight prompts of 2 short responses (the distillation job's step): fewer rows than
    prompts, each holding the 24 tokens its prompts share once."""
    families = [f for f in _families(40, seed=1) if f.prompt[:24] == list(range(1000, 1024))]
    families = [_Family(f.prompt, f.members, 18) for f in families[:8]]
    rows = _packed(families, 576)
    assert len(rows) < 8 and all(r.shared >= 24 for r in rows if len(r.families) > 1)
