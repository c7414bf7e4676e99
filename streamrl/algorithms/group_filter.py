"""Torch-free group filtering for the buffer (DAPO dynamic sampling, arXiv 2503.14476).

A prompt group whose samples all got the same reward has zero advantage under GRPO, Dr.GRPO and
RLOO: it costs a training slot and teaches nothing. DAPO over-samples and drops such groups.
The buffer calls this before admitting groups, and the buffer never imports torch, so neither
does this module (``rewards.zero_variance_groups`` is the tensor version for the learner).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["filter_zero_variance", "has_reward_variance"]


def has_reward_variance(rewards: Sequence[float], tol: float = 0.0) -> bool:
    """True if ``max(rewards) - min(rewards) > tol``; an empty or one-sample group has none."""
    if len(rewards) < 2:
        return False
    return max(rewards) - min(rewards) > tol


def filter_zero_variance(
    groups_rewards: Sequence[Sequence[float]], tol: float = 0.0
) -> tuple[list[bool], int]:
    """Which groups to keep: ``(keep_mask, dropped)`` with one bool per group.

    A group is kept iff its rewards are not all equal (spread above ``tol``). A singleton or empty
    group has all its rewards equal and is dropped too: it has no baseline to learn against.

    Example: ``filter_zero_variance([[1, 0], [1, 1], [0.5]])`` is ``([True, False, False], 2)``.
    """
    keep = [has_reward_variance(rewards, tol) for rewards in groups_rewards]
    return keep, len(keep) - sum(keep)
