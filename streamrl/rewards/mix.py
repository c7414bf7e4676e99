"""How several rewards' scores become one reward per response: normalise each, weight, sum.

Each configured reward (``rewards:``; a rule, a reward model or a judge) gives one raw score
per response of a group. Per reward, in config order:

1. A score its scorer could not give (None: a judge's unparsable verdict) is imputed with the
   mean of the group's other scores from that reward (all missing: 0), so it adds no advantage
   either way; the caller counts it. Never a silent 0 next to real scores.
2. ``normalize``: ``none`` keeps the score; ``group`` subtracts the group's mean and divides by
   its std (population; a constant group gives 0s), as GRPO normalises its advantage within a
   group. ``running`` is read as ``group``: it used the running mean and std of every score
   one generator process had seen, so the same score weighed differently in one batch by the
   generator that sampled it, and a restart reset it (issue 52). Normalised within its group
   only, a reward depends on nothing but the group's scores: any generator, any order, any
   restart gives a group the same rewards.
3. The reward is the weighted sum of the normalised scores.

Worked example (weights 1 and 0.5, the second normalised within the group)::

    rule  [1, 0]      -> [1, 0]
    model [2.0, 4.0]  -> group mean 3, std 1 -> [-1, 1]
    reward = [1 + 0.5 * -1, 0 + 0.5 * 1] = [0.5, 0.5]

Stdlib only (the generator's sampling and the tests import it).
"""

from __future__ import annotations

import math
from typing import Literal

Normalize = Literal["none", "running", "group"]
EPS = 1e-6


def impute(scores: list[float | None]) -> tuple[list[float], int]:
    """Missing scores replaced by the mean of the present ones (none present: 0); how many."""
    present = [s for s in scores if s is not None]
    fill = sum(present) / len(present) if present else 0.0
    return [fill if s is None else s for s in scores], len(scores) - len(present)


def _group_normalised(scores: list[float]) -> list[float]:
    mean = sum(scores) / len(scores)
    std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))
    return [(s - mean) / std if std > EPS else 0.0 for s in scores]


class RewardMix:
    """The weights and normalisations of a job's rewards. Stateless: a group's rewards are a
    function of its own scores alone (module doc), the same in every generator process."""

    def __init__(self, weights: list[float], normalize: list[Normalize]) -> None:
        if len(weights) != len(normalize):
            raise ValueError(f"{len(weights)} weights but {len(normalize)} normalisations")
        self.weights, self.normalize = list(weights), list(normalize)

    @property
    def plain(self) -> bool:
        """One reward, unnormalised: the reward is its score times its weight, as ever."""
        return len(self.weights) == 1 and self.normalize[0] == "none"

    def combine(self, parts: list[list[float | None]]) -> tuple[list[float], list[int]]:
        """``parts[i][j]``: reward i's raw score of response j of one group. Returns each
        response's reward and, per reward, how many scores were imputed (module doc)."""
        if len(parts) != len(self.weights):
            raise ValueError(f"{len(parts)} rewards' scores for {len(self.weights)} rewards")
        size = len(parts[0]) if parts else 0
        total = [0.0] * size
        missing = []
        for i, raw in enumerate(parts):
            if len(raw) != size:
                raise ValueError(f"reward {i}: {len(raw)} scores for a group of {size}")
            scores, absent = impute(raw)
            missing.append(absent)
            normalised = scores if self.normalize[i] == "none" else _group_normalised(scores)
            for j, value in enumerate(normalised):
                total[j] += self.weights[i] * value
        return total, missing
