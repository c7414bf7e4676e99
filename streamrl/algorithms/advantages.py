"""Advantage estimators: group baselines for outcome rewards (GRPO, Dr.GRPO, RLOO) and GAE.

Group estimators take one scalar score per sample and the id of the prompt group it belongs to.
Group ids are arbitrary int64 values (not necessarily contiguous); they are mapped to dense slots
with a sort and a cumulative sum, so nothing here reads a tensor value on the host (no
``torch.unique``, no ``.item()``) and the learner's step never waits on the device here.

The config picks a group estimator by name from ``ADVANTAGES``; GAE needs a critic and has its own
signature, so it is called directly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = [
    "ADVANTAGES",
    "distill",
    "dr_grpo",
    "gae",
    "group_index",
    "grpo",
    "masked_whiten",
    "rloo",
]


def _float(x: Tensor) -> Tensor:
    """Scores may arrive as int/bool (0/1 rewards) or bf16; compute in at least float32."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def group_index(group_ids: Tensor) -> Tensor:
    """Map arbitrary group ids to dense slots in ``[0, N)`` without a host sync.

    Shapes: ``group_ids[N]`` (any integer dtype) -> ``Tensor[N]`` (int64). Samples with equal ids
    get equal slots; slots are ordered by id. ``N`` slots are always enough, so callers size their
    per-group buffers by ``N`` instead of asking the device how many groups there are.

    Example: ``group_index(tensor([7, 3, 7, 9]))`` is ``tensor([1, 0, 1, 2])``.
    """
    sorted_ids, order = torch.sort(group_ids, stable=True)
    is_new = torch.zeros_like(sorted_ids, dtype=torch.long)
    is_new[1:] = (sorted_ids[1:] != sorted_ids[:-1]).long()
    dense_sorted = is_new.cumsum(0)
    return torch.empty_like(dense_sorted).scatter_(0, order, dense_sorted)


def _segment_sum(values: Tensor, index: Tensor) -> Tensor:
    """Per-sample sum over the sample's group: ``out[i] = sum_{j: index[j]=index[i]} values[j]``."""
    totals = torch.zeros(values.shape[0], dtype=values.dtype, device=values.device)
    return totals.index_add_(0, index, values)[index]


def _group_stats(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample group size, group mean and unbiased group variance (0 for singletons)."""
    index = group_index(group_ids)
    count = _segment_sum(torch.ones_like(scores), index)
    mean = _segment_sum(scores, index) / count
    # Two-pass variance: sum of squared deviations, numerically stable for large offsets.
    var = _segment_sum((scores - mean) ** 2, index) / (count - 1).clamp(min=1)
    return count, mean, var


def grpo(
    scores: Tensor,
    group_ids: Tensor,
    *,
    std_normalize: bool = True,
    eps: float = 1e-6,
    std_floor: float = 0.0,
) -> Tensor:
    """GRPO group-normalised advantage (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300).

    Shapes: ``scores[N]``, ``group_ids[N]`` (int64) -> ``Tensor[N]`` (float32 or wider).

        A_i = (s_i - mean_g(s)) / (std_g(s) + eps)      std: unbiased (divides by n_g - 1)

    With ``std_floor > 0`` the divisor is ``max(std_g, std_floor)``: a group whose scores differ
    only by small shaping terms (a format bonus, part credit for a near miss) keeps a small
    advantage instead of being scaled up to the size of a right-versus-wrong group's. Why: with
    plain std normalisation a group of eight wrong answers 0.1 apart in part credit pulls as hard
    as a group with a right answer. Measured on the default job (floor 0.5, three seeds,
    docs/experiments.md, 2026-11-26) it did not make learning more robust; it stays off there.

    With ``std_normalize=False`` this is Dr.GRPO's ``A_i = s_i - mean_g(s)`` (Liu et al. 2025,
    arXiv 2503.20783), which drops the division by std that over-weights easy and hard prompts.

    A group of one sample has no baseline; as in verl, it gets mean 0 and std 1, so its advantage
    is ``s / (1 + eps)`` (or ``s`` without std normalisation): the raw score, not zero. The output
    carries the advantage for every token of the sample once broadcast over ``T``.
    """
    scores = _float(scores)
    count, mean, var = _group_stats(scores, group_ids)
    singleton = count < 2
    mean = torch.where(singleton, torch.zeros_like(mean), mean)
    centred = scores - mean
    if not std_normalize:
        return centred
    std = torch.where(singleton, torch.ones_like(var), var.sqrt().clamp(min=std_floor))
    return centred / (std + eps)


def dr_grpo(scores: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """Dr.GRPO advantage ``s_i - mean_g(s)`` (Liu et al. 2025, arXiv 2503.20783).

    Shapes: ``scores[N]``, ``group_ids[N]`` -> ``Tensor[N]``. A singleton group keeps its raw score.
    Pair it with a length-unbiased aggregation (``seq-mean-token-sum-norm``), as the paper does.
    ``eps`` is accepted (and unused) so every entry of ``ADVANTAGES`` takes the same keywords.
    """
    del eps
    return grpo(scores, group_ids, std_normalize=False)


def rloo(scores: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """REINFORCE leave-one-out advantage (Ahmadian et al. 2024, "Back to Basics", arXiv 2402.14740).

    Shapes: ``scores[N]``, ``group_ids[N]`` -> ``Tensor[N]``.

        A_i = s_i - (1 / (n_g - 1)) * sum_{j in g, j != i} s_j  =  n_g / (n_g - 1) * (s_i - mean_g)

    The baseline excludes the sample itself, so the estimate is unbiased. A singleton group has no
    other sample to form a baseline from and gets advantage 0 (it contributes no gradient).
    ``eps`` is accepted (and unused) so every entry of ``ADVANTAGES`` takes the same keywords.
    """
    del eps
    scores = _float(scores)
    index = group_index(group_ids)
    count = _segment_sum(torch.ones_like(scores), index)
    total = _segment_sum(scores, index)
    advantage = scores - (total - scores) / (count - 1).clamp(min=1)
    return torch.where(count < 2, torch.zeros_like(advantage), advantage)


GroupAdvantage = Callable[..., Tensor]

# Config name -> estimator with signature ``(scores[N], group_ids[N], *, eps) -> Tensor[N]``;
# ``grpo`` also takes ``std_floor`` (the config allows a floor with grpo only).
ADVANTAGES: dict[str, GroupAdvantage] = {"grpo": grpo, "dr_grpo": dr_grpo, "rloo": rloo}


def gae(
    rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2015, arXiv 1506.02438).

    Shapes: ``rewards[B,T]``, ``values[B,T]``, ``mask[B,T]`` (bool or 0/1) -> ``(advantages[B,T],
    returns[B,T])``. Backwards over ``t`` for tokens with ``mask=1``:

        delta_t = r_t + gamma * V_next - V_t
        A_t     = delta_t + gamma * lam * A_next
        returns = A + V

    where ``V_next``/``A_next`` are the value and advantage of the next masked-in token (0 after
    the last). A masked-out position (an observation or tool-output token in a multi-turn episode,
    or padding) is skipped: it carries ``V_next`` and ``A_next`` through unchanged, so the turn
    before it bootstraps from the turn after it, as in verl's multi-turn GAE. Its own advantage
    is the carried value and its reward is ignored: put rewards on masked-in tokens.

    No whitening happens here; call ``masked_whiten`` on the result if you want it. The loop runs
    ``T`` small kernels and never reads values on the host.
    """
    rewards, values = _float(rewards), _float(values)
    keep = mask.to(torch.bool)
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in range(rewards.shape[1] - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage_t = delta + gamma * lam * next_advantage
        next_advantage = torch.where(keep[:, t], advantage_t, next_advantage)
        next_value = torch.where(keep[:, t], values[:, t], next_value)
        advantages[:, t] = next_advantage
    return advantages, advantages + values


def masked_whiten(
    x: Tensor,
    mask: Tensor,
    shift_mean: bool = True,
    eps: float = 1e-8,
    *,
    all_reduce: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """Whiten ``x`` with the mean and unbiased variance of its masked-in entries.

    Shapes: ``x[...]``, ``mask[...]`` (same shape, bool or 0/1) -> ``Tensor[...]``.

        out = (x - mu) / sqrt(var + eps)          (+ mu again when ``shift_mean=False``)

    The same affine map is applied to every entry, masked-out ones included (the loss masks them).
    With fewer than two masked-in entries the variance is taken as 0 and the mean of an empty
    mask as 0, so the result is finite, never NaN. ``all_reduce`` (a sum over ranks, e.g.
    ``dist.all_reduce``) makes ``mu`` and ``var`` those of every rank's entries together, so
    the result does not depend on how the batch is split over ranks.
    """
    x = _float(x)
    keep = mask.to(torch.bool)
    kept = torch.where(keep, x, torch.zeros_like(x))
    totals = torch.stack([keep.sum().to(x.dtype), kept.sum()])
    if all_reduce is not None:
        totals = all_reduce(totals)
    n, total = totals[0], totals[1]
    mean = total / n.clamp(min=1)
    sq_dev = torch.where(keep, (x - mean) ** 2, torch.zeros_like(x)).sum()
    if all_reduce is not None:
        sq_dev = all_reduce(sq_dev)
    var = sq_dev / (n - 1).clamp(min=1)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    return whitened if shift_mean else whitened + mean


def distill(teacher: Tensor, behavior: Tensor, coef: Tensor, mask: Tensor) -> Tensor:
    """On-policy distillation's per-token advantage: the negative sampled reverse KL.

    Shapes: ``teacher[B, T]``, ``behavior[B, T]`` (logprobs of the sampled tokens under the
    teacher and the policy that sampled them), ``coef[B]``, ``mask[B, T]`` -> ``Tensor[B, T]``.

        A_t = coef * (log pi_teacher(y_t) - log mu(y_t))        (0 where mask is 0)

    Added to the reward's advantage token by token, it is the policy gradient of
    ``-coef * KL(pi || pi_teacher)`` estimated on the sampled tokens (Agarwal et al. 2024,
    GKD, arXiv 2306.13649; Thinking Machines' on-policy distillation, 2025): a token the
    teacher finds likelier than the student did is pushed up, one it finds unlikely down.
    The behaviour logprob, not the learner's, is the student's side: with a stale batch the
    loss's importance weights correct for the policy that sampled (``losses.policy_loss``),
    as for every other advantage.

    Example: teacher [-0.2, -3.0], behaviour [-0.1, -0.5], coef 1 -> [-0.1, -2.5].
    """
    term = coef[:, None] * (teacher - behavior)
    return torch.where(mask.bool(), term, torch.zeros_like(term))
