"""Algorithm-side reward shaping: length penalties, zero-variance groups, token-level rewards.

These act on scores a verifier already produced (the verifier registry is ``streamrl.rewards``).
All functions are pure and sync-free; ``filter_zero_variance`` is the torch-free list version
used by the buffer, re-exported from ``group_filter``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from streamrl.algorithms.advantages import group_index
from streamrl.algorithms.group_filter import filter_zero_variance

__all__ = [
    "filter_zero_variance",
    "overlong_penalty",
    "token_level_rewards",
    "zero_variance_groups",
]


def overlong_penalty(
    lengths: Tensor,
    max_len: int,
    buffer_len: int,
    factor: float = 1.0,
    *,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13).

    Shapes: ``lengths[N]`` (response lengths in tokens) -> ``Tensor[N]``, added to the score.
    With ``L_exp = max_len - buffer_len``:

        0                                   if len <= L_exp
        (L_exp - len) / buffer_len * factor if L_exp < len <= max_len   (linear ramp to -factor)
        -factor                             if len > max_len

    ``buffer_len = 0`` is the hard version: ``-factor`` beyond ``max_len``, 0 otherwise.
    """
    if not 0 <= buffer_len <= max_len:
        raise ValueError(f"need 0 <= buffer_len <= max_len, got {buffer_len} and {max_len}")
    lengths = lengths.to(dtype)
    if buffer_len == 0:
        return torch.where(lengths > max_len, -factor, 0.0).to(dtype)
    ramp = (max_len - buffer_len - lengths) / buffer_len
    return ramp.clamp(-1.0, 0.0) * factor


def zero_variance_groups(scores: Tensor, group_ids: Tensor, *, tol: float = 0.0) -> Tensor:
    """DAPO dynamic sampling test (arXiv 2503.14476): does each sample's group lack variance?

    Shapes: ``scores[N]``, ``group_ids[N]`` (arbitrary int64 ids) -> ``BoolTensor[N]``, True for
    every sample of a group whose scores are all equal (``max - min <= tol``). A singleton group
    counts as zero-variance, as in ``group_filter.filter_zero_variance``.
    """
    index = group_index(group_ids)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    n = scores.shape[0]
    high = scores.new_full((n,), -torch.inf).scatter_reduce(0, index, scores, "amax")
    low = scores.new_full((n,), torch.inf).scatter_reduce(0, index, scores, "amin")
    return (high - low)[index] <= tol


def token_level_rewards(
    scores: Tensor,
    mask: Tensor,
    *,
    kl: Tensor | None = None,
    kl_coef: float = 0.0,
) -> Tensor:
    """Spread sequence scores over tokens for GAE, with an optional per-token KL penalty.

    Shapes: ``scores[B]``, ``mask[B,T]``, ``kl[B,T]`` (e.g. ``kl.estimate``) -> ``Tensor[B,T]``.

        r_t = score * [t is the last masked-in token] - kl_coef * kl_t * m_t

    This is the "KL in reward" form of InstructGPT (Ouyang et al. 2022); a row without masked-in
    tokens gets no reward at all.
    """
    keep = mask.to(torch.bool)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    position = keep.long().cumsum(dim=-1)
    is_last = keep & (position == position[:, -1:])
    rewards = torch.where(is_last, scores.unsqueeze(-1), 0.0)
    if kl is not None:
        rewards = rewards - kl_coef * torch.where(keep, kl.to(scores.dtype), 0.0)
    return rewards
