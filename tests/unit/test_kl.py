"""KL estimators and controllers against plain-Python references."""

from __future__ import annotations

import math

import pytest
import torch

from streamrl.algorithms import kl


def ref_estimate(lp: float, ref: float, kind: str) -> float:
    delta = lp - ref
    if kind == "k1":
        return delta
    if kind == "abs":
        return abs(delta)
    if kind == "k2":
        return 0.5 * delta * delta
    x = min(max(ref - lp, -20.0), 20.0)
    return min(max(math.exp(x) - x - 1, -10.0), 10.0)


@pytest.mark.parametrize("kind", ["k1", "abs", "k2", "k3"])
def test_estimators_match_reference_including_extremes(kind: str) -> None:
    gen = torch.Generator().manual_seed(0)
    lp = torch.randn(4, 6, generator=gen, dtype=torch.float64) - 1
    ref = lp + 0.5 * torch.randn(4, 6, generator=gen, dtype=torch.float64)
    ref[0, 0], ref[1, 1], ref[2, 2] = lp[0, 0] + 50, lp[1, 1] - 50, lp[2, 2]
    expected = [
        [ref_estimate(a, b, kind) for a, b in zip(row_a, row_b, strict=True)]
        for row_a, row_b in zip(lp.tolist(), ref.tolist(), strict=True)
    ]
    torch.testing.assert_close(kl.estimate(lp, ref, kind), torch.tensor(expected).double())

    lp32 = lp.float().requires_grad_(True)
    out = kl.estimate(lp32, ref.float(), kind)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(lp32.grad).all()


def test_k3_is_non_negative_and_zero_on_policy() -> None:
    lp = torch.randn(100, dtype=torch.float64)
    ref = lp + torch.randn(100, dtype=torch.float64)
    assert (kl.estimate(lp, ref, "k3") >= 0).all()
    assert torch.equal(kl.estimate(lp, lp, "k3"), torch.zeros(100, dtype=torch.float64))


def test_k3_hand_computed() -> None:
    # x = ref - lp = 1: e - 2.
    got = kl.estimate(torch.tensor([0.0]), torch.tensor([1.0]), "k3")
    assert got.item() == pytest.approx(math.e - 2)
    capped = kl.estimate(torch.tensor([0.0]), torch.tensor([30.0]), "k3")
    assert capped.item() == 10.0


def test_registry_and_unknown_kind() -> None:
    assert set(kl.KL_ESTIMATORS) == {"k1", "abs", "k2", "k3"}
    with pytest.raises(ValueError, match="k3"):
        kl.estimate(torch.zeros(1), torch.zeros(1), "low_var")


def test_fixed_controller() -> None:
    controller = kl.FixedController(0.05)
    controller.update(100.0, 1000)
    assert controller.value == 0.05


def test_adaptive_controller_matches_reference() -> None:
    controller = kl.AdaptiveController(0.1, target=6.0, horizon=10000)
    controller.update(12.0, 500)  # error clipped to +0.2
    assert controller.value == pytest.approx(0.101)

    controller = kl.AdaptiveController(0.2, target=2.0, horizon=100)
    coef = 0.2
    for current, steps in [(0.5, 10), (2.2, 7), (1.9, 30), (100.0, 1), (0.0, 50)]:
        controller.update(current, steps)
        coef *= 1 + min(max(current / 2.0 - 1, -0.2), 0.2) * steps / 100
        assert controller.value == pytest.approx(coef)
    assert controller.value < 0.2


def test_make_controller() -> None:
    assert isinstance(kl.make_controller(0.1), kl.FixedController)
    adaptive = kl.make_controller(0.1, target=1.0, horizon=5)
    assert isinstance(adaptive, kl.AdaptiveController) and adaptive.value == 0.1
    with pytest.raises(ValueError):
        kl.AdaptiveController(0.1, target=0.0, horizon=5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_estimators_do_not_sync_on_cuda() -> None:
    lp, ref = torch.randn(4, 16, device="cuda"), torch.randn(4, 16, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for kind in kl.KL_ESTIMATORS:
            kl.estimate(lp, ref, kind)
    finally:
        torch.cuda.set_sync_debug_mode("default")
