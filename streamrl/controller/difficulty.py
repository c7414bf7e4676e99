"""Difficulty-aware sampling (``data.sampler: difficulty``): prompts that every sample solves,
or none does, are asked less often.

A group whose samples all score alike ("flat": solved by every sample, or by none, in the
rewards' eyes) carries no GRPO signal and is dropped by the shard (``buffer.drop_zero_variance``),
so generating it is wasted. Generators report each group they scored as (prompt index, flat)
(``GeneratorReport.outcomes``); the controller keys it by the prompt's question
(``Prompt.key``: a task's commuted expression, a table row's prompt) and keeps, per question,
its flat rate (an exponential average of its groups, the newest weighing ``RECENCY``). When
admission hands out a fresh prompt index, the question it draws is kept with probability
``1 - (1 - data.difficulty_keep) * flat_rate`` (a coin seeded by the run's seed and the
index, so a rerun of the same history skips the same indices) and passed over otherwise: the
stream moves on, the index is never generated. A question never scored is always asked, and
a flat one is still asked ``difficulty_keep`` of the time, so a question the policy has since
learned (or unlearned) is seen again. Prompts handed out again (a dead generator's, a rolled-
back step's) are never skipped: they are owed. The held-out split is untouched (evaluation
draws its own prompts).

Example: ``difficulty_keep`` 0.25; "7 + 5" came back flat twice (rate 0.75): kept with
probability 0.44.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from streamrl.config import Config
from streamrl.protocol import GeneratorReport

# Weight of a question's newest group in its flat rate.
RECENCY = 0.5


@dataclass
class DifficultySampler:
    config: Config
    keep_share: float
    # Question key -> flat rate of its scored groups.
    flat_rate: dict[str, float] = field(default_factory=dict)
    # (generator id, incarnation) -> groups of it already taken.
    seen: dict[tuple[int, int], int] = field(default_factory=dict)
    skipped: int = 0
    scored: int = 0

    def __post_init__(self) -> None:
        from streamrl.data import prompt_stream  # reads the source: not at import

        self.stream = prompt_stream(self.config)

    @classmethod
    def of(cls, config: Config) -> DifficultySampler | None:
        if config.data.sampler != "difficulty":
            return None
        return cls(config, config.data.difficulty_keep)

    def key(self, index: int) -> str:
        prompt = self.stream[index]
        return prompt.key or prompt.prompt_id

    def take(self, report: GeneratorReport) -> None:
        """The outcomes of ``report`` not taken yet (reports are cumulative snapshots of the
        newest outcomes: a lost report's are in the next, up to its window)."""
        ident = (report.generator_id, report.incarnation)
        done = self.seen.get(ident, 0)
        first = report.outcomes_total - len(report.outcome_indices)
        for position, (index, flat) in enumerate(
            zip(report.outcome_indices, report.outcome_flat, strict=True), start=first
        ):
            if position < done or index < 0:
                continue
            key = self.key(index)
            old = self.flat_rate.get(key)
            value = float(flat)
            self.flat_rate[key] = value if old is None else (1 - RECENCY) * old + RECENCY * value
            self.scored += 1
        self.seen[ident] = max(done, report.outcomes_total)

    def keep(self, index: int) -> bool:
        """Whether fresh prompt ``index`` is asked (module doc); counts those passed over."""
        rate = self.flat_rate.get(self.key(index))
        if rate is None:
            return True
        probability = 1.0 - (1.0 - self.keep_share) * rate
        coin = random.Random(f"difficulty:{self.config.run.seed}:{index}").random()
        if coin < probability:
            return True
        self.skipped += 1
        return False

    def summary(self) -> dict[str, float]:
        flat = sum(1 for rate in self.flat_rate.values() if rate >= 0.5)
        return {
            "prompts_skipped": self.skipped,
            "groups_scored": self.scored,
            "questions_seen": len(self.flat_rate),
            "questions_mostly_flat": flat,
        }
