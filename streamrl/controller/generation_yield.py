"""Useful generation: how much of what the generators sampled ended in a gradient.

Generation is what a run pays for. Its unit here is the policy token (an episode's environment
tokens not counted), as generators count ``tokens_generated``. Each shard counts the policy
tokens of its groups by fate (``ShardStats.tokens_by_fate``: "trained" at a group's first take,
else the reason it was dropped unused) and those it stores now; the rest of what was generated
never reached a shard. So, over the run:

    generated = trained + zero_variance + probe + guidance + stale + filtered + in_buffer
                + refused

- ``zero_variance``: every sample of the group scored alike (``buffer.drop_zero_variance``);
- ``probe``: probe responses whose prompts were passed over (``generator.probe_candidates``),
  counted by their generators;
- ``guidance``: samples whose place in their group a reference response took
  (``algorithm.guidance``), counted by their generators;
- ``stale``: older than the staleness bound, or sampled from weights a learner restart took back;
- ``filtered``: refused at a shard for another reason (duplicate, too large, overflow, invalid);
- ``in_buffer``: stored, not trained yet (at the end: never trained);
- ``refused``: never reached a shard: refused at the generator (reward errors and timeouts, a
  quarantined request), or in flight when counted.

``useful`` = trained / generated. Shown on the console line, in each step's record
(``generation/*``), in ``summary.json`` (``generation``), in the admin ``/status`` and in
``streamrl bench``. A shard process that restarted counts its tokens from then on, so after a
shard restart ``refused`` also holds what the dead process had counted.

Example: 1,000 tokens generated, shards counted trained 340, zero_variance 600, stale 10, with
20 stored: ``useful`` 0.34, ``lost`` {zero_variance 0.60, probe 0, guidance 0, stale 0.01,
filtered 0, in_buffer 0.02, refused 0.03}.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from streamrl.protocol import GeneratorReport, ShardStats

# A shard's fate -> the reason a user reads.
LOSS_OF_FATE = {
    "zero_variance": "zero_variance",
    "stale": "stale",
    "dead_timeline": "stale",
    "duplicate": "filtered",
    "too_large": "filtered",
    "overflow": "filtered",
    "capacity": "filtered",
    "invalid": "filtered",
}
LOSSES = ("zero_variance", "probe", "guidance", "stale", "filtered", "in_buffer", "refused")


@dataclass
class GenerationYield:
    """Policy tokens generated, and what became of them (module doc)."""

    generated: int = 0
    trained: int = 0
    lost: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LOSSES, 0))
    # Groups trained with a reference response in place of a sample (``algorithm.guidance``).
    groups_guided: int = 0
    # Groups settled by their first samples, and the samples not generated for them
    # (``generator.screen_samples``).
    groups_settled_early: int = 0
    samples_spared: int = 0

    @property
    def useful(self) -> float:
        """The share of generated tokens that ended in a gradient (0 before any)."""
        return self.trained / self.generated if self.generated else 0.0

    def shares(self) -> dict[str, float]:
        """Each loss as a share of what was generated."""
        n = self.generated or 1
        return {why: tokens / n for why, tokens in self.lost.items()}

    def record(self) -> dict[str, float]:
        """A step record's ``generation/*`` figures."""
        return {
            "generation/useful": self.useful,
            "generation/tokens_total": float(self.generated),
            "generation/trained_tokens_total": float(self.trained),
            "generation/groups_guided_total": float(self.groups_guided),
            "generation/groups_settled_early_total": float(self.groups_settled_early),
            **{f"generation/lost/{why}": share for why, share in self.shares().items()},
        }

    def summary(self) -> dict[str, Any]:
        """``summary.json``'s and ``/status``'s ``generation``."""
        return {
            "useful": round(self.useful, 4),
            "tokens": self.generated,
            "trained_tokens": self.trained,
            "groups_guided": self.groups_guided,
            "groups_settled_early": self.groups_settled_early,
            "samples_spared": self.samples_spared,
            "lost_tokens": dict(self.lost),
            "lost": {why: round(share, 4) for why, share in self.shares().items()},
        }


def generation_yield(
    generators: list[GeneratorReport], shards: list[ShardStats]
) -> GenerationYield:
    """The run's yield from its generators' reports (every process, replaced ones too) and
    its shards' newest stats."""
    fates: Counter[str] = Counter()
    stored = 0
    for shard in shards:
        fates.update(shard.tokens_by_fate)
        stored += shard.stored_policy_tokens
    lost = dict.fromkeys(LOSSES, 0)
    for fate, tokens in fates.items():
        if fate != "trained":
            lost[LOSS_OF_FATE.get(fate, "filtered")] += tokens
    lost["in_buffer"] = stored
    lost["probe"] = sum(g.probe_tokens_passed_over for g in generators)
    lost["guidance"] = sum(g.guidance_tokens_displaced for g in generators)
    generated = sum(g.tokens_generated for g in generators)
    reached = fates["trained"] + sum(lost.values())
    # Reports arrive at their own pace: a shard may count a group before its generator's
    # report counts its tokens. What was generated is never less than what reached a shard.
    generated = max(generated, reached)
    lost["refused"] = generated - reached
    return GenerationYield(
        generated,
        fates["trained"],
        lost,
        groups_guided=sum(g.groups_guided for g in generators),
        groups_settled_early=sum(g.groups_settled_early for g in generators),
        samples_spared=sum(g.samples_spared for g in generators),
    )
