"""Torch-free test for DAPO dynamic sampling (arXiv 2503.14476), used by the buffer.

A prompt group whose samples all got the same reward has zero advantage under GRPO, Dr.GRPO and
RLOO: it costs a training slot and teaches nothing. With ``buffer.drop_zero_variance`` (live-
tunable) a shard refuses such groups at admission and counts them as ``zero_variance`` drops
(``buffers.replay.ReplayStore.offer``); generators keep sampling, so the learner's batches
fill with groups that carry signal. The buffer never imports torch, so neither does this.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["has_reward_variance"]


def has_reward_variance(rewards: Sequence[float], tol: float = 0.0) -> bool:
    """True if ``max(rewards) - min(rewards) > tol``; an empty or one-sample group has none.

    Example: ``has_reward_variance([1, 0])`` is True, ``has_reward_variance([0.5, 0.5])`` False.
    """
    if len(rewards) < 2:
        return False
    return max(rewards) - min(rewards) > tol
