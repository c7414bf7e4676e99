"""Screening (``generator.screen_samples``, N >= 2): each group's first N samples are generated
and scored before the rest, and a group they settle is not sampled further.

Why: a group whose samples all score alike carries no GRPO signal, and the shard drops it
(``buffer.drop_zero_variance``). With guidance on, the default job's remaining waste is such
groups all right alike: 13-23% of its generated tokens (docs/experiments.md, 2026-12-05). A
group whose first N samples already agree is flat at G with chance ``(p^G + (1-p)^G) /
(p^N + (1-p)^N)`` for a question answered right with chance p (0.81 at p = 0.95, N = 4, G =
8): its remaining G - N samples are mostly wasted. Such a group is settled at N samples
(delivered flat; the shard drops and counts it as zero variance), the others get their G - N
more in a second engine call. This is the adaptive sample budget of the issue: fewer samples
where the outcome is already clear, the full group where it is not.

A group is settled early only where no sample could change what it teaches: its first N
samples score alike, and, with guidance, no worse than its reference (a group all wrong alike
trains on its reference, so it is sampled in full). The decision reads the rules' scores, so a
job with a served reward (a reward model, a judge, a teacher) is refused, as are episodes and
probe sampling (config ``_finalize``).

Cost, stated: a group not settled is sampled in two engine calls, so its prompt is prefilled
twice and its decode takes two passes; a group settled saves G - N samples. Signal, stated:
a question right with chance p between (say) 0.7 and 0.95 is settled without the one wrong
sample that would have pushed it down with chance ``p^N - p^G``.

Example: G = 8, N = 4, rewards of the first four [2, 2, 2, 2] and reference 2 -> settled (four
samples, flat); [2, 2, 0.5, 2] -> four more sampled; [0.5] x 4 with reference 2 -> four more.
"""

from __future__ import annotations

from streamrl.algorithms.group_filter import has_reward_variance


class Screening:
    """The group's first ``first`` of ``size`` samples, and the choice of going on
    (``first == size``: screening off, every group sampled whole in one call)."""

    def __init__(self, first: int, size: int) -> None:
        self.first, self.size = first, size
        self.active = first < size
        self.groups_settled = 0  # groups settled at ``first`` samples
        self.samples_saved = 0  # samples not generated for them

    def settles(self, sampled: list[float], reference: float | None) -> bool:
        """Whether the first samples' rewards ``sampled`` settle their group (all alike and,
        with a reference, no worse than its reward); counts the group when they do."""
        if has_reward_variance(sampled) or not sampled:
            return False
        if reference is not None and sampled[0] < reference:
            return False
        self.groups_settled += 1
        self.samples_saved += self.size - len(sampled)
        return True
