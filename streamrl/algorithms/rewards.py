"""Algorithm-side reward shaping: the DAPO overlong penalty and token-level rewards for GAE.

These act on scores a verifier already produced (the verifier registry is ``streamrl.rewards``);
the learner applies them (``workers.learning.train_step``). All functions are pure and sync-free.
The zero-variance group filter lives in the buffer (``group_filter``).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["longest_policy_turn", "overlong_penalty", "token_level_rewards"]


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


def longest_policy_turn(action_mask: bytes, num_tokens: int) -> int:
    """The length that ``overlong_penalty`` judges: the tokens of the longest policy turn.

    ``action_mask`` is a trajectory's (one byte per response token, 1: sampled by the policy,
    0: written by the environment), so a turn is a run of 1s. Each turn was sampled under its
    own ``max_new_tokens`` cap; the environment's tokens and the other turns do not count
    towards it. An empty mask is a single-turn response, one turn of ``num_tokens``.

    Example: mask ``1 1 1 0 0 1 1 1 1 1 0 1`` -> 5 (not 12, nor the 9 policy tokens).
    """
    if not action_mask:
        return num_tokens
    return max(map(len, action_mask.split(b"\x00")))


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
