"""What a learner step measures (docs/design.md §5b): ``StepMetrics`` holds the step's sums,
token-weighted means and maxima and reduces them over ranks once; ``batch_figures`` measures the
batch as it arrives (staleness, a lagged teacher's lag, lengths), ``mismatch_figures`` the
learner's logprobs against the behaviour's (the check of the numerics at staleness 0, and the
drift by versions of lag that the staleness tuner reads). Every rank adds the same metric names.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from streamrl.algorithms import kl as kl_lib
from streamrl.protocol import TrajectoryGroup
from streamrl.workers.learning.batching import MicroBatch

STALENESS_BINS = 9  # groups at staleness 0..7, and 8 or more


def staleness_bin(k: int) -> str:
    """Metric name of the staleness histogram's bin ``k`` (the last bin holds k or more)."""
    return f"staleness/groups_at_{k}" + ("_or_more" if k == STALENESS_BINS - 1 else "")


class StepMetrics:
    """One step's metrics as sums, token-weighted means and maxima, reduced over ranks once.
    Values stay on ``device`` until ``reduce``: adding one never waits for the GPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.sums: dict[str, torch.Tensor] = {}
        self.weights: dict[str, torch.Tensor] = {}
        self.maxima: dict[str, torch.Tensor] = {}

    def add(self, name: str, value: torch.Tensor | float) -> None:
        """A plain sum over micro-batches and ranks."""
        self.mean(name, value, None)

    def mean(self, name: str, value: torch.Tensor | float, weight: torch.Tensor | None) -> None:
        """``value`` is a mean over ``weight`` items (tokens): the result is the weighted mean."""
        value = self._on_device(value)
        if weight is not None:
            weight = self._on_device(weight)
            value = value * weight
            self.weights[name] = self.weights.get(name, 0.0) + weight
        self.sums[name] = self.sums.get(name, 0.0) + value

    def max(self, name: str, value: torch.Tensor | float) -> None:
        value = self._on_device(value)
        self.maxima[name] = torch.maximum(self.maxima.get(name, value), value)

    def _on_device(self, value: torch.Tensor | float) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            return value.detach().to(self.device, torch.float64, non_blocking=True)
        return torch.tensor(float(value), dtype=torch.float64, device=self.device)

    def reduce(self) -> dict[str, float]:
        """Two collectives (sums, maxima) and the step's one device-to-host copy."""
        names, weighted, peaks = sorted(self.sums), sorted(self.weights), sorted(self.maxima)
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        total = torch.stack(
            [self.sums[n] for n in names] + [self.weights[n] for n in weighted] + [zero]
        )
        total = all_reduce(total, dist.ReduceOp.SUM).cpu()
        peak = all_reduce(torch.stack([self.maxima[n] for n in peaks] + [zero]), dist.ReduceOp.MAX)
        peak = peak.cpu()
        out = {n: float(total[i]) for i, n in enumerate(names)}
        for j, name in enumerate(weighted):
            weight = float(total[len(names) + j])
            if weight > 0:
                out[name] /= weight
            else:
                del out[name]  # nothing was measured (e.g. no on-policy token this step)
        out.update({n: float(peak[i]) for i, n in enumerate(peaks)})
        return out


def all_reduce(t: torch.Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM) -> torch.Tensor:
    dist.all_reduce(t, op=op)
    return t


def batch_figures(
    groups: list[TrajectoryGroup], version: int, metrics: StepMetrics, *, lagged_teacher: bool
) -> None:
    """What the step trains on: staleness (mean, max, a histogram), a lagged teacher's lag
    behind the groups it scored, response lengths and policy turns."""
    staleness = torch.tensor([float(version - g.min_version) for g in groups])
    metrics.mean("staleness/mean", staleness.mean(), float(len(groups)))
    metrics.max("staleness/max", staleness.max())
    if lagged_teacher:  # a lagged copy's versions behind the groups it scored
        lags: list[float] = []
        for g in groups:
            newest = g.max_version  # a pass over the group: once, not per trajectory
            lags += [
                float(newest - t.teacher_version) for t in g.trajectories if t.teacher_version >= 0
            ]
        lag = torch.tensor(lags or [0.0])
        metrics.mean("distill/teacher_lag", lag.mean(), float(len(lags)))
        metrics.max("distill/teacher_lag_max", lag.max())
    # A histogram with a fixed set of keys (every rank must reduce the same names); the
    # empty bins are dropped after the reduction.
    counts = torch.bincount(staleness.long().clamp(0, STALENESS_BINS - 1), minlength=STALENESS_BINS)
    for k, count in enumerate(counts):
        metrics.add(staleness_bin(k), count)
    lengths = torch.tensor([float(t.num_response_tokens) for g in groups for t in g.trajectories])
    metrics.add("train/response_tokens", lengths.sum())
    # The spread of lengths (multi-turn episodes: a synchronous step waits for its longest)
    # and the policy turns per trajectory (0 for single-turn ones).
    metrics.max("train/response_tokens_max", lengths.max())
    turns = torch.tensor([float(t.turns) for g in groups for t in g.trajectories])
    metrics.mean("train/turns_mean", turns.mean(), float(len(turns)))


def mismatch_figures(
    batch: MicroBatch, learner: torch.Tensor, version: int, metrics: StepMetrics
) -> None:
    """Learner vs behaviour logprobs on the tokens sampled with ``version``'s weights
    (masked reductions, no host sync; a step with none reports no mismatch figures).

    A response that an in-flight update reached mid-way sampled its later tokens on a KV
    cache the earlier weights wrote, which the learner's forward recomputes on the new
    ones: those tokens differ by more than rounding (countdown_gym, AVX2: 32 such tokens,
    mean 0.046, against 1.5e-6 for the rest). They are measured apart
    (``mismatch/after_update_*``), so ``mismatch/*`` stays a check of the numerics."""
    behavior = batch.behavior.to(learner.device)
    mask = batch.mask.bool().to(learner.device)
    if batch.guided is not None:  # a reference response has no behaviour to compare
        mask = mask & ~batch.guided.to(learner.device)[:, None]
    versions = batch.versions.to(learner.device)
    current = mask & (versions == version)
    after_update = current & (mask & (versions != version)).any(-1, keepdim=True)
    on_policy = current & ~after_update
    count = on_policy.sum()
    diff = (learner.float() - behavior).abs()
    gap = torch.where(on_policy, diff, 0.0)
    per_token_k3 = kl_lib.estimate(behavior, learner.float(), "k3")
    k3 = torch.where(on_policy, per_token_k3, 0.0)
    metrics.add("mismatch/tokens", count)
    mean_of = count.clamp(min=1)
    metrics.mean("mismatch/logprob_abs_mean", gap.sum() / mean_of, count)
    metrics.mean("mismatch/k3", k3.sum() / mean_of, count)
    metrics.max("mismatch/logprob_abs_max", gap.amax())
    late = after_update.sum()
    metrics.add("mismatch/after_update_tokens", late)
    late_gap = torch.where(after_update, diff, 0.0).sum() / late.clamp(min=1)
    metrics.mean("mismatch/after_update_logprob_abs_mean", late_gap, late)
    # The same KL on the tokens sampled versions behind, by how many: how far one
    # version of lag moves the policy (the learning rate's doing) apart from how many
    # versions the bound lets in (the staleness tuner's guard reads both).
    lag = version - versions
    for name, at_lag in (
        ("drift/k3_lag1", lag == 1),
        ("drift/k3_lag2", lag == 2),
        ("drift/k3_lag3plus", lag >= 3),
    ):
        at = mask & at_lag
        n = at.sum()
        metrics.mean(name, torch.where(at, per_token_k3, 0.0).sum() / n.clamp(min=1), n)
