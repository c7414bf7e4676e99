"""KL penalty towards a reference policy: per-token estimators and coefficient controllers.

Estimators follow Schulman's note "Approximating KL divergence" (2020): with samples from the
current policy pi and ``delta = log pi - log pi_ref``,

- ``k1``  = delta                         unbiased for KL(pi || ref), high variance, can be < 0
- ``abs`` = |delta|
- ``k2``  = 1/2 delta^2                   biased, low variance
- ``k3``  = e^x - x - 1, x = log pi_ref - log pi   unbiased and >= 0 (GRPO's choice, arXiv
  2402.03300; verl's ``low_var_kl``): x is clamped to [-20, 20] and the result to [-10, 10]

Controllers are plain Python on floats: the learner reduces the batch KL to one float per step
(where it syncs anyway for logging) and feeds it to ``update``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from torch import Tensor

__all__ = [
    "KL_ESTIMATORS",
    "AdaptiveController",
    "FixedController",
    "KLController",
    "estimate",
    "make_controller",
]


def _k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return logprobs - ref_logprobs


def _abs(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return (logprobs - ref_logprobs).abs()


def _k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return 0.5 * (logprobs - ref_logprobs) ** 2


def _k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    x = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return (x.exp() - x - 1).clamp(-10.0, 10.0)


# Config name -> (logprobs[B,T], ref_logprobs[B,T]) -> per-token estimate [B,T].
KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "k1": _k1,
    "abs": _abs,
    "k2": _k2,
    "k3": _k3,
}


def estimate(logprobs: Tensor, ref_logprobs: Tensor, kind: str) -> Tensor:
    """Per-token KL estimate: ``logprobs[B,T]``, ``ref_logprobs[B,T]`` -> ``Tensor[B,T]``.

    ``kind`` is a key of ``KL_ESTIMATORS`` (see the module docstring for the formulas). Gradients
    flow into both inputs; detach ``ref_logprobs`` (they normally come from a frozen model).
    Padding is not masked here: aggregate with ``losses.aggregate`` and the response mask.
    """
    try:
        estimator = KL_ESTIMATORS[kind]
    except KeyError:
        choices = sorted(KL_ESTIMATORS)
        raise ValueError(f"unknown KL estimator {kind!r}; choose from {choices}") from None
    return estimator(logprobs, ref_logprobs)


class KLController(Protocol):
    """Something that holds the KL coefficient and may adapt it once per step."""

    @property
    def value(self) -> float: ...

    def update(self, current_kl: float, n_steps: int) -> None: ...

    def restore(self, value: float) -> None:
        """Adopt a coefficient saved in a checkpoint."""


class FixedController:
    """A constant KL coefficient; ``update`` does nothing."""

    def __init__(self, coef: float) -> None:
        self._coef = float(coef)

    @property
    def value(self) -> float:
        return self._coef

    def update(self, current_kl: float, n_steps: int) -> None:
        del current_kl, n_steps

    def restore(self, value: float) -> None:
        del value  # fixed: the config's coefficient stands


class AdaptiveController:
    """Adaptive KL coefficient (Ziegler et al. 2019, arXiv 1909.08593, §2.2).

        e    = clip(KL / target - 1, -0.2, 0.2)
        coef = coef * (1 + e * n_steps / horizon)

    The coefficient grows while the measured KL is above ``target`` and shrinks below it, by at
    most 20% per ``horizon`` steps. ``n_steps`` is how many samples (or steps, in whatever unit
    ``horizon`` is counted) the measurement covers.

    Example: ``AdaptiveController(0.1, target=6.0, horizon=10000).update(12.0, 500)`` gives
    ``0.1 * (1 + 0.2 * 500 / 10000) = 0.101``.
    """

    def __init__(self, init_coef: float, target: float, horizon: int) -> None:
        if target <= 0 or horizon <= 0:
            raise ValueError(f"target and horizon must be > 0, got {target} and {horizon}")
        self._coef = float(init_coef)
        self.target = float(target)
        self.horizon = int(horizon)

    @property
    def value(self) -> float:
        return self._coef

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self._coef *= 1.0 + error * n_steps / self.horizon

    def restore(self, value: float) -> None:
        self._coef = float(value)


def make_controller(coef: float, target: float | None = None, horizon: int = 10000) -> KLController:
    """A fixed controller when ``target`` is None, else an adaptive one starting at ``coef``."""
    if target is None:
        return FixedController(coef)
    return AdaptiveController(coef, target, horizon)
