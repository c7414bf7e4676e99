"""The entropy bonus's coefficient: fixed, or steered towards a target entropy.

A policy that settles on one answer per prompt scores every sample of a group alike, dynamic
sampling drops the group, and the run starves (docs/experiments.md, countdown_gym: 2.23 ->
0.26 nats per token in 24 steps). A fixed bonus large enough to stop that early is too large
for the rest of the run, so ``EntropyControl`` acts on the measurement instead (Skywork-OR1's
adaptive entropy control, He et al. 2025, arXiv 2505.22312, §3.2):

    c_{k+1} = clip(c_k + step, 0, max)  if H_k < target
              clip(c_k - step, 0, max)  otherwise
    bonus applied: c_k * [H < target]   (H of the micro-batch being trained, no host sync)

``H_k`` is step k's token-mean entropy over its trained tokens at their sampling temperature
(``policy/entropy``, the same on every rank). Nothing acts while the policy keeps its
entropy; the coefficient grows for as long as it stays below the target and decays once it
is back. Plain Python on floats, like the KL controllers (``streamrl.algorithms.kl``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["EntropyControl"]


class EntropyControl:
    """The entropy coefficient of one learner (every rank holds an identical one).

    Example: ``EntropyControl(0.0, target=1.0, step=0.01, max_coef=0.1)``; after
    ``update(0.6)`` twice, ``value`` is 0.02; after ``update(1.4)``, 0.01.
    """

    def __init__(
        self, coef: float, *, target: float | None = None, step: float = 0.0, max_coef: float = 0.0
    ) -> None:
        if coef < 0 or step < 0:
            raise ValueError(f"entropy coefficient and step must be >= 0, got {coef} and {step}")
        if target is not None and target <= 0:
            raise ValueError(f"entropy target must be > 0 nats per token, got {target}")
        self._coef, self.target, self.step = float(coef), target, float(step)
        self.max_coef = max(float(max_coef), self._coef)

    @classmethod
    def from_config(cls, algorithm: Any) -> EntropyControl:
        """From ``config.algorithm`` (``entropy_coef``, ``entropy_target``, ``entropy_coef_step``,
        ``entropy_coef_max``)."""
        return cls(
            algorithm.entropy_coef,
            target=algorithm.entropy_target,
            step=algorithm.entropy_coef_step,
            max_coef=algorithm.entropy_coef_max,
        )

    @property
    def value(self) -> float:
        """The coefficient for the coming step (0: no bonus, the entropy is only measured)."""
        return self._coef

    @property
    def gated(self) -> bool:
        """The bonus applies only to micro-batches whose entropy is below ``target``."""
        return self.target is not None

    def update(self, entropy: float) -> None:
        """Feed the step's measured entropy; a fixed coefficient (no target) stays as it is."""
        if self.target is None:
            return
        moved = self._coef + (self.step if entropy < self.target else -self.step)
        self._coef = min(max(moved, 0.0), self.max_coef)

    def restore(self, value: float) -> None:
        """Adopt a coefficient saved in a checkpoint (a fixed one keeps the config's)."""
        if self.target is not None:
            self._coef = min(max(float(value), 0.0), self.max_coef)
