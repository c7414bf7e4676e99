"""How several rewards' scores become one reward per response: normalise each, weight, sum.

Each configured reward (``rewards:``; a rule, a reward model or a judge) gives one raw score
per response of a group. Per reward, in config order:

1. A score its scorer could not give (None: a judge's unparsable verdict) is imputed with the
   mean of the group's other scores from that reward (all missing: 0), so it adds no advantage
   either way; the caller counts it. Never a silent 0 next to real scores.
2. ``normalize``: ``none`` keeps the score; ``running`` subtracts the running mean and divides
   by the running std of every score this process has seen of that reward, this group's
   included (Welford; std floor ``EPS``); ``group`` subtracts the group's mean and divides by
   its std (a constant group gives 0s).
3. The reward is the weighted sum of the normalised scores.

Worked example (weights 1 and 0.5, the second normalised within the group)::

    rule  [1, 0]      -> [1, 0]
    model [2.0, 4.0]  -> group mean 3, std 1 -> [-1, 1]
    reward = [1 + 0.5 * -1, 0 + 0.5 * 1] = [0.5, 0.5]

Stdlib only (the generator's sampling and the tests import it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Normalize = Literal["none", "running", "group"]
EPS = 1e-6


@dataclass
class RunningStats:
    """Welford's running mean and variance (population)."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (value - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count else 0.0


def impute(scores: list[float | None]) -> tuple[list[float], int]:
    """Missing scores replaced by the mean of the present ones (none present: 0); how many."""
    present = [s for s in scores if s is not None]
    fill = sum(present) / len(present) if present else 0.0
    return [fill if s is None else s for s in scores], len(scores) - len(present)


def _group_normalised(scores: list[float]) -> list[float]:
    mean = sum(scores) / len(scores)
    std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))
    return [(s - mean) / max(std, EPS) if std > EPS else 0.0 for s in scores]


class RewardMix:
    """The weights and normalisations of a job's rewards, with the running statistics of
    those normalised ``running`` (one per reward, owned by this process)."""

    def __init__(self, weights: list[float], normalize: list[Normalize]) -> None:
        if len(weights) != len(normalize):
            raise ValueError(f"{len(weights)} weights but {len(normalize)} normalisations")
        self.weights, self.normalize = list(weights), list(normalize)
        self.stats = [RunningStats() for _ in weights]

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
            normalised = self._normalised(i, scores, [s for s in raw if s is not None])
            for j, value in enumerate(normalised):
                total[j] += self.weights[i] * value
        return total, missing

    def _normalised(self, i: int, scores: list[float], present: list[float]) -> list[float]:
        how = self.normalize[i]
        if how == "none":
            return scores
        if how == "group":
            return _group_normalised(scores)
        stats = self.stats[i]
        for value in present:  # imputed values would shrink the std: not counted
            stats.add(value)
        std = stats.std
        return [(s - stats.mean) / std if std > EPS else 0.0 for s in scores]
