"""Micro-batch plans: runs of rows, or token budgets over trajectories sorted by length, made
the same count on every rank; per-row values paired back in step order."""

from __future__ import annotations

import random

import pytest
import torch
from support import random_groups

from streamrl.workers.learning.batching import (
    build_micro_batches,
    in_step_order,
    micro_batch_rows,
    resize_plan,
)


def _ids(raw: bytes) -> list[int]:
    return torch.frombuffer(bytearray(raw), dtype=torch.int32).tolist()


def _padded(plan: list[list[int]], lengths: list[int]) -> int:
    return sum(len(rows) * max(lengths[i] for i in rows) for rows in plan)


def _is_partition(plan: list[list[int]], n: int) -> bool:
    return sorted(i for rows in plan for i in rows) == list(range(n))


def test_without_a_budget_rows_run_in_order() -> None:
    assert micro_batch_rows([5, 1, 9, 2, 7], size=2) == [[0, 1], [2, 3], [4]]


def test_a_budget_bounds_padded_tokens_and_sorts_longest_first() -> None:
    lengths = [3, 9, 4, 8]
    assert micro_batch_rows(lengths, size=99, token_budget=16) == [[1], [3, 2], [0]]
    rng = random.Random(0)
    for _ in range(200):
        lengths = [rng.randrange(1, 60) for _ in range(rng.randrange(1, 40))]
        budget = rng.randrange(1, 400)
        plan = micro_batch_rows(lengths, size=1, token_budget=budget)
        assert _is_partition(plan, len(lengths))
        for rows in plan:  # within budget, unless one trajectory alone exceeds it
            assert len(rows) == 1 or len(rows) * max(lengths[i] for i in rows) <= budget
        widths = [max(lengths[i] for i in rows) for rows in plan]
        assert widths == sorted(widths, reverse=True)


def test_sorting_pads_less_than_arrival_order() -> None:
    rng = random.Random(1)
    lengths = [rng.choice([10, 60]) for _ in range(32)]
    by_rows = micro_batch_rows(lengths, size=8)
    by_tokens = micro_batch_rows(lengths, size=8, token_budget=8 * 60)
    assert _padded(by_tokens, lengths) < 0.7 * _padded(by_rows, lengths)


@pytest.mark.parametrize("count", [1, 2, 5, 9, 12])
def test_resize_plan_reaches_any_count_keeping_every_row_once(count: int) -> None:
    lengths = [4, 11, 7, 7, 2, 9, 3, 12, 5, 6, 8, 1]
    plan = micro_batch_rows(lengths, size=1, token_budget=24)
    resized = resize_plan(plan, lengths, count)
    assert len(resized) == count
    assert _is_partition(resized, len(lengths))
    assert all(resized)


def test_resize_plan_rejects_more_micro_batches_than_rows() -> None:
    with pytest.raises(ValueError, match="cannot plan 4 micro-batches for 3 trajectories"):
        resize_plan([[0, 1, 2]], [1, 2, 3], 4)


def test_micro_batches_follow_the_plan_and_pair_values_in_step_order() -> None:
    groups = random_groups(2, 4, seed=5)
    trajectories = [t for g in groups for t in g.trajectories]
    lengths = [t.num_prompt_tokens + t.num_response_tokens for t in trajectories]
    plan = micro_batch_rows(lengths, size=1, token_budget=30)
    batches = build_micro_batches(groups, 1, pad_id=0, plan=plan, first_row=10)
    for batch, rows in zip(batches, plan, strict=True):
        assert batch.rows.tolist() == [10 + i for i in rows]
        for r, i in enumerate(rows):  # row r holds trajectory i, right-padded
            ids = _ids(trajectories[i].prompt_ids) + _ids(trajectories[i].response_ids)
            assert batch.input_ids[r, : len(ids)].tolist() == ids
        assert batch.input_ids.shape[1] == max(lengths[i] for i in rows)
    # Per-row values computed micro-batch by micro-batch come back in step order.
    for batch in batches:
        batch.rows -= 10
    values = [batch.response_lengths.float() for batch in batches]
    expected = torch.tensor([float(t.num_response_tokens) for t in trajectories])
    assert torch.equal(in_step_order(batches, values), expected)
