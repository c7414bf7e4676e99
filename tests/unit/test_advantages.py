"""Advantage estimators against float64 plain-Python references."""

from __future__ import annotations

import math

import pytest
import torch

from streamrl.algorithms import advantages as adv


def _groups(ids: list[int]) -> dict[int, list[int]]:
    members: dict[int, list[int]] = {}
    for i, g in enumerate(ids):
        members.setdefault(g, []).append(i)
    return members


def ref_grpo(scores: list[float], ids: list[int], std_normalize: bool, eps: float) -> list[float]:
    out = [0.0] * len(scores)
    for members in _groups(ids).values():
        vals = [scores[i] for i in members]
        n = len(vals)
        mean, std = (0.0, 1.0)
        if n > 1:
            mean = sum(vals) / n
            std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
        for i in members:
            out[i] = (scores[i] - mean) / (std + eps) if std_normalize else scores[i] - mean
    return out


def ref_rloo(scores: list[float], ids: list[int]) -> list[float]:
    out = [0.0] * len(scores)
    for members in _groups(ids).values():
        for i in members:
            others = [scores[j] for j in members if j != i]
            out[i] = scores[i] - sum(others) / len(others) if others else 0.0
    return out


def random_batch(seed: int, n: int = 41) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    # Arbitrary, non-contiguous ids (negative and huge included), plus guaranteed singletons.
    pool = torch.tensor([-7, 3, 2**40, 11, 12, -1])
    ids = pool[torch.randint(len(pool), (n - 2,), generator=gen)]
    ids = torch.cat([ids, torch.tensor([555, 2**50])])
    ids = ids[torch.randperm(n, generator=gen)]
    scores = torch.randn(n, generator=gen, dtype=torch.float64) * 3 + 100
    return scores, ids


def test_group_index_is_dense_and_consistent() -> None:
    ids = torch.tensor([7, 3, 7, 9, -2, 3])
    index = adv.group_index(ids)
    assert index.tolist() == [2, 1, 2, 3, 0, 1]
    assert adv.group_index(torch.zeros(0, dtype=torch.long)).numel() == 0


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("std_normalize", [True, False])
def test_grpo_matches_reference(seed: int, std_normalize: bool) -> None:
    scores, ids = random_batch(seed)
    expected = ref_grpo(scores.tolist(), ids.tolist(), std_normalize, 1e-6)
    got64 = adv.grpo(scores, ids, std_normalize=std_normalize)
    torch.testing.assert_close(got64, torch.tensor(expected, dtype=torch.float64))
    got32 = adv.grpo(scores.float(), ids, std_normalize=std_normalize)
    assert got32.dtype == torch.float32
    torch.testing.assert_close(got32.double(), got64, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("seed", range(4))
def test_rloo_matches_reference(seed: int) -> None:
    scores, ids = random_batch(seed)
    expected = torch.tensor(ref_rloo(scores.tolist(), ids.tolist()), dtype=torch.float64)
    torch.testing.assert_close(adv.rloo(scores, ids), expected)


def test_hand_computed_group() -> None:
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0])
    ids = torch.tensor([5, 5, 5, 5])
    half_over_std = 0.5 / math.sqrt(1 / 3)  # mean 0.5, unbiased std sqrt(1/3)
    torch.testing.assert_close(
        adv.grpo(scores, ids, eps=0.0), torch.tensor([1, -1, 1, -1]) * half_over_std
    )
    torch.testing.assert_close(adv.dr_grpo(scores, ids), torch.tensor([0.5, -0.5, 0.5, -0.5]))
    # RLOO: 1 - (0 + 1 + 0) / 3 = 2/3 and 0 - (1 + 1 + 0) / 3 = -2/3.
    torch.testing.assert_close(adv.rloo(scores, ids), torch.tensor([2, -2, 2, -2]) / 3)


def test_singleton_group_reads_mean_zero_std_one() -> None:
    scores, ids = torch.tensor([3.0]), torch.tensor([42])
    torch.testing.assert_close(adv.grpo(scores, ids), torch.tensor([3.0 / (1 + 1e-6)]))
    torch.testing.assert_close(adv.dr_grpo(scores, ids), torch.tensor([3.0]))
    torch.testing.assert_close(adv.rloo(scores, ids), torch.tensor([0.0]))


def test_zero_variance_group_gives_zero_not_nan() -> None:
    scores, ids = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 1, 1])
    out = adv.grpo(scores, ids)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[:3], torch.zeros(3))


def test_integer_scores_and_empty_batch() -> None:
    out = adv.grpo(torch.tensor([1, 0, 1, 1]), torch.tensor([0, 0, 1, 1]))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    for name, fn in adv.ADVANTAGES.items():
        empty = fn(torch.zeros(0), torch.zeros(0, dtype=torch.long), eps=1e-6)
        assert empty.shape == (0,), name


def test_registry_names_and_shared_signature() -> None:
    assert set(adv.ADVANTAGES) == {"grpo", "dr_grpo", "rloo"}
    scores, ids = random_batch(0)
    for fn in adv.ADVANTAGES.values():
        assert fn(scores, ids, eps=1e-6).shape == scores.shape
    torch.testing.assert_close(
        adv.ADVANTAGES["dr_grpo"](scores, ids), adv.grpo(scores, ids, std_normalize=False)
    )


def ref_gae(
    rewards: list[list[float]],
    values: list[list[float]],
    mask: list[list[int]],
    gamma: float,
    lam: float,
) -> tuple[list[list[float]], list[list[float]]]:
    advs, rets = [], []
    for r, v, m in zip(rewards, values, mask, strict=True):
        row = [0.0] * len(r)
        next_value, next_adv = 0.0, 0.0
        for t in reversed(range(len(r))):
            if m[t]:
                next_adv = r[t] + gamma * next_value - v[t] + gamma * lam * next_adv
                next_value = v[t]
            row[t] = next_adv
        advs.append(row)
        rets.append([a + b for a, b in zip(row, v, strict=True)])
    return advs, rets


def test_gae_hand_computed_multi_turn() -> None:
    # The middle token is an observation: it is skipped, turn 1 bootstraps from turn 2.
    rewards = torch.tensor([[0.0, 5.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 9.0, 0.2]], dtype=torch.float64)
    mask = torch.tensor([[1, 0, 1]])
    advantages, returns = adv.gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # t=2: 1 - 0.2 = 0.8; t=1 carries 0.8; t=0: 0.9 * 0.2 - 0.5 + 0.72 * 0.8 = 0.256.
    torch.testing.assert_close(advantages, torch.tensor([[0.256, 0.8, 0.8]], dtype=torch.float64))
    torch.testing.assert_close(returns, advantages + values)


@pytest.mark.parametrize("seed", range(3))
def test_gae_matches_reference(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    b, t = 5, 9
    rewards = torch.randn(b, t, generator=gen, dtype=torch.float64)
    values = torch.randn(b, t, generator=gen, dtype=torch.float64)
    mask = (torch.rand(b, t, generator=gen) > 0.3).long()
    mask[0] = 0  # an empty row
    mask[1, 6:] = 0  # right padding
    expected_adv, expected_ret = ref_gae(
        rewards.tolist(), values.tolist(), mask.tolist(), 0.97, 0.9
    )
    got_adv, got_ret = adv.gae(rewards, values, mask.bool(), gamma=0.97, lam=0.9)
    torch.testing.assert_close(got_adv, torch.tensor(expected_adv, dtype=torch.float64))
    torch.testing.assert_close(got_ret, torch.tensor(expected_ret, dtype=torch.float64))
    got32, _ = adv.gae(rewards.float(), values.float(), mask, gamma=0.97, lam=0.9)
    torch.testing.assert_close(got32.double(), got_adv, atol=1e-5, rtol=1e-5)


def test_gae_lambda_one_is_discounted_return_minus_value() -> None:
    rewards = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    values = torch.tensor([[0.1, 0.2, 0.3]], dtype=torch.float64)
    advantages, returns = adv.gae(rewards, values, torch.ones(1, 3), gamma=0.5, lam=1.0)
    torch.testing.assert_close(returns, torch.tensor([[1 + 1 + 0.75, 2 + 1.5, 3.0]]).double())


def ref_whiten(x: list[float], m: list[int], shift_mean: bool) -> list[float]:
    kept = [v for v, k in zip(x, m, strict=True) if k]
    mean = sum(kept) / len(kept)
    var = sum((v - mean) ** 2 for v in kept) / (len(kept) - 1)
    out = [(v - mean) / math.sqrt(var + 1e-8) for v in x]
    return out if shift_mean else [v + mean for v in out]


@pytest.mark.parametrize("shift_mean", [True, False])
def test_masked_whiten_matches_reference(shift_mean: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 6, generator=gen, dtype=torch.float64) * 5 + 2
    mask = torch.rand(4, 6, generator=gen) > 0.4
    got = adv.masked_whiten(x, mask, shift_mean=shift_mean)
    expected = ref_whiten(x.flatten().tolist(), mask.flatten().long().tolist(), shift_mean)
    torch.testing.assert_close(got.flatten(), torch.tensor(expected, dtype=torch.float64))


def test_masked_whiten_degenerate_masks_are_finite() -> None:
    x = torch.randn(3, 4)
    assert torch.isfinite(adv.masked_whiten(x, torch.zeros(3, 4))).all()
    one = torch.zeros(3, 4)
    one[1, 2] = 1
    assert torch.isfinite(adv.masked_whiten(x, one)).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_advantages_do_not_sync_on_cuda() -> None:
    scores = torch.randn(64, device="cuda")
    ids = torch.randint(0, 10**12, (64,), device="cuda")
    rewards, values = torch.randn(4, 16, device="cuda"), torch.randn(4, 16, device="cuda")
    mask = torch.rand(4, 16, device="cuda") > 0.3
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for fn in adv.ADVANTAGES.values():
            fn(scores, ids, eps=1e-6)
        advantages, _ = adv.gae(rewards, values, mask, gamma=1.0, lam=0.95)
        adv.masked_whiten(advantages, mask)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_std_floor_keeps_small_shaping_differences_small() -> None:
    """A group whose scores differ only by part credit (std 0.05) keeps advantages of that
    size under a floor of 0.5; a right-vs-wrong group (std above the floor) is unchanged."""
    shaping_only = torch.tensor([0.25, 0.35, 0.25, 0.25])
    right_wrong = torch.tensor([2.0, 0.25, 0.25, 0.25])
    scores = torch.cat([shaping_only, right_wrong])
    ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    plain = adv.grpo(scores, ids)
    floored = adv.grpo(scores, ids, std_floor=0.5)
    centred = shaping_only - shaping_only.mean()
    torch.testing.assert_close(floored[:4], centred / (0.5 + 1e-6))
    torch.testing.assert_close(floored[4:], plain[4:])
    assert plain[:4].abs().max() > 1.0 > 0.2 > floored[:4].abs().max()


def test_std_floor_is_refused_for_other_estimators() -> None:
    from streamrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="std_floor applies to advantage grpo only"):
        load_config(None, ["algorithm.advantage=rloo", "algorithm.std_floor=0.5"])
    assert load_config(None, ["algorithm.std_floor=0.5"]).algorithm.std_floor == 0.5
