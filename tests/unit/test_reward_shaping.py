"""Algorithm-side reward shaping and the torch-free group filter, against Python references."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from streamrl.algorithms import rewards
from streamrl.algorithms.group_filter import filter_zero_variance, has_reward_variance


def ref_overlong(length: int, max_len: int, buffer_len: int, factor: float) -> float:
    expected_len = max_len - buffer_len
    if length <= expected_len:
        return 0.0
    if length <= max_len:
        return (expected_len - length) / buffer_len * factor
    return -factor


@pytest.mark.parametrize(
    ("max_len", "buffer_len", "factor"), [(20, 8, 1.0), (20, 1, 0.5), (16, 16, 2.0)]
)
def test_overlong_penalty_matches_reference(max_len: int, buffer_len: int, factor: float) -> None:
    lengths = torch.arange(0, max_len + 6)
    expected = [ref_overlong(n, max_len, buffer_len, factor) for n in lengths.tolist()]
    got = rewards.overlong_penalty(lengths, max_len, buffer_len, factor)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, torch.tensor(expected))


def test_overlong_penalty_hand_computed_and_hard_version() -> None:
    # max 100, buffer 20: 80 is free, 90 is halfway down the ramp, 100 is -1, 120 is -1.
    got = rewards.overlong_penalty(torch.tensor([50, 80, 90, 100, 120]), 100, 20)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))
    hard = rewards.overlong_penalty(torch.tensor([99, 100, 101]), 100, 0, factor=3.0)
    torch.testing.assert_close(hard, torch.tensor([0.0, 0.0, -3.0]))
    with pytest.raises(ValueError):
        rewards.overlong_penalty(torch.tensor([1]), 10, 11)


def ref_zero_variance(scores: list[float], ids: list[int], tol: float) -> list[bool]:
    by_group: dict[int, list[float]] = {}
    for s, g in zip(scores, ids, strict=True):
        by_group.setdefault(g, []).append(s)
    return [max(by_group[g]) - min(by_group[g]) <= tol for g in ids]


@pytest.mark.parametrize("seed", range(3))
def test_zero_variance_groups_matches_reference(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.tensor([-3, 2**40, 7, 8])[torch.randint(4, (30,), generator=gen)]
    ids = torch.cat([ids, torch.tensor([99])])  # a singleton
    scores = torch.randint(2, (31,), generator=gen).double()
    scores[ids == 7] = 1.0  # one all-equal group
    for tol in (0.0, 0.5, 2.0):
        expected = ref_zero_variance(scores.tolist(), ids.tolist(), tol)
        got = rewards.zero_variance_groups(scores, ids, tol=tol)
        assert got.dtype == torch.bool and got.tolist() == expected


def test_zero_variance_groups_hand_computed() -> None:
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5])
    ids = torch.tensor([4, 4, 9, 9, 12])
    got = rewards.zero_variance_groups(scores, ids)
    assert got.tolist() == [True, True, False, False, True]


def test_filter_zero_variance() -> None:
    assert filter_zero_variance([[1, 0], [1, 1], [0.5]]) == ([True, False, False], 2)
    assert filter_zero_variance([]) == ([], 0)
    assert filter_zero_variance([[], [0.0, 0.0, 1e-9]]) == ([False, True], 1)
    assert filter_zero_variance([[0.0, 0.0, 1e-9]], tol=1e-6) == ([False], 1)
    assert not has_reward_variance([2.0])
    assert rewards.filter_zero_variance is filter_zero_variance


def test_filter_agrees_with_tensor_version() -> None:
    groups = [[1.0, 0.0, 1.0], [1.0, 1.0], [0.0], [0.2, 0.2, 0.2, 0.3]]
    keep, dropped = filter_zero_variance(groups)
    scores = torch.tensor([s for g in groups for s in g])
    ids = torch.tensor([i for i, g in enumerate(groups) for _ in g])
    flags = rewards.zero_variance_groups(scores, ids)
    first = [sum(len(g) for g in groups[:i]) for i in range(len(groups))]
    assert keep == [not flags[i].item() for i in first]
    assert dropped == 2


def test_group_filter_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import streamrl.algorithms\n"
        "from streamrl.algorithms.group_filter import filter_zero_variance\n"
        "from streamrl.algorithms import filter_zero_variance as again\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    repo_root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=repo_root)


def test_token_level_rewards() -> None:
    scores = torch.tensor([1.0, 2.0, 3.0])
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]])
    got = rewards.token_level_rewards(scores, mask)
    expected = torch.zeros(3, 5)
    expected[0, 3], expected[2, 0] = 1.0, 3.0
    torch.testing.assert_close(got, expected)

    kl = torch.full((3, 5), 0.5)
    with_kl = rewards.token_level_rewards(scores, mask, kl=kl, kl_coef=0.1)
    torch.testing.assert_close(with_kl, expected - 0.05 * mask)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_shaping_does_not_sync_on_cuda() -> None:
    lengths = torch.randint(0, 40, (64,), device="cuda")
    scores = torch.randint(2, (64,), device="cuda").float()
    ids = torch.randint(0, 10**9, (64,), device="cuda")
    mask = torch.rand(64, 16, device="cuda") > 0.3
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        rewards.overlong_penalty(lengths, 32, 8)
        rewards.zero_variance_groups(scores, ids)
        rewards.token_level_rewards(scores, mask, kl=torch.rand_like(mask.float()), kl_coef=0.1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
