"""One learner step: a rank's share of a batch -> one new version (docs/design.md §5b).

    groups -> scores      reward + DAPO overlong penalty (- KL to the reference, in reward)
           -> advantages  group baseline per trajectory, or GAE from the critic, whitened
                          over every rank's response tokens
           -> start pass  no grad, only with more than one update per batch: the proximal
                          logprobs of decoupled PPO (AReaL), so that the clip acts
           -> updates     ppo_epochs x mini_batches: forward/backward per micro-batch, one
                          optimizer step per mini-batch (skipped if the gradient norm is not
                          finite); the version advances once per batch, outside this module
           -> metrics     reduced over ranks once (one all-reduce of sums, one of maxima)

Reduction rule (docs/design.md §5b): every loss term is a per-token quantity aggregated by
``loss_agg`` over the whole mini-batch on every rank, with the global denominator (tokens for
``token-mean``, sequences otherwise; ``seq-mean-token-sum-norm`` divides by the constant
``generator.max_new_tokens``, as verl uses the maximum response length). Each micro-batch adds
numerator / global denominator; FSDP2 averages gradients over ranks, hence ``* world_size``.
So the gradient is the same for any micro-batch size and any rank count.

Consistency: the forward conditions on exactly the sampled tokens (right padding, no mask;
see ``batching``), at each response's sampling temperature, on the bf16 weight image
(``fsdp``). Mismatch is measured on every step over the tokens sampled with the weights held
at the start of the step (``token_versions == version``): learner logprob vs behaviour
logprob (``mismatch/*``). At max_staleness 0 it is numerical noise (docs/algorithms.md).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from streamrl.algorithms import advantages as adv
from streamrl.algorithms import kl as kl_lib
from streamrl.algorithms import losses
from streamrl.algorithms import rewards as shaping
from streamrl.algorithms.entropy import EntropyControl
from streamrl.config import Config
from streamrl.protocol import TrajectoryGroup
from streamrl.workers.learning.batching import (
    MicroBatch,
    build_micro_batches,
    in_step_order,
    micro_batch_rows,
    resize_plan,
    split_groups,
)
from streamrl.workers.learning.fsdp import clip_and_step, reshard, set_gradient_sync
from streamrl.workers.learning.step_figures import (
    STALENESS_BINS,
    StepMetrics,
    all_reduce,
    batch_figures,
    mismatch_figures,
    staleness_bin,
)
from streamrl.workers.shared_prompts import can_share_prompts, has_sliding_window

log = logging.getLogger(__name__)


def lr_multiplier(version: int, config: Config) -> float:
    """Linear warmup over ``warmup_steps`` versions, then constant or cosine decay to
    ``min_lr_ratio`` at ``run.max_steps``. Example: warmup 4 -> 0.25, 0.5, 0.75, 1, 1, ..."""
    lc = config.learner
    if version < lc.warmup_steps:
        return (version + 1) / lc.warmup_steps
    if lc.lr_schedule == "constant":
        return 1.0
    span = max(1, config.run.max_steps - lc.warmup_steps)
    progress = min(1.0, (version - lc.warmup_steps) / span)
    return lc.min_lr_ratio + (1 - lc.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def at_sampling_temperature(
    per_token: Callable[..., torch.Tensor],
    batch: MicroBatch,
    logits: torch.Tensor,
    *per_row: torch.Tensor,
) -> Any:
    """``per_token(logits, *per_row, temperature=t)`` -> [B, T] (or a tuple of such, as
    ``losses.token_logprobs_and_entropy`` returns), each row at the temperature ``t`` it was
    sampled at (``losses.token_logprobs``, ``losses.token_entropy``).

    A micro-batch holds rows of several temperatures after a live temperature change. The
    division by ``t`` stays inside ``losses``' chunked kernel, in float32: dividing the
    [B, T, V] logits first, in their compute dtype, rounds both the temperature and the
    quotient to bf16 under a bf16 forward (0.7 becomes 0.69921875), and a float32 copy of the
    logits would take twice their memory until backward. So the rows are cut into runs of one
    temperature (views, no copy) and ``per_token`` runs once per run; a uniform micro-batch is
    a single call. A row's result is then the one it has in a micro-batch of its own.
    """
    # Temperatures stay on the host (``batching``): reading them costs no device sync.
    runs = [(t, len(list(rows))) for t, rows in itertools.groupby(batch.temperatures.tolist())]
    if len(runs) == 1:
        return per_token(logits, *per_row, temperature=runs[0][0])
    sizes = [n for _, n in runs]
    parts = zip(logits.split(sizes), *(x.split(sizes) for x in per_row), strict=True)
    outs = [per_token(*part, temperature=t) for part, (t, _) in zip(parts, runs, strict=True)]
    if isinstance(outs[0], tuple):  # several results per row: each joined on its own
        return tuple(torch.cat(list(out)) for out in zip(*outs, strict=True))
    return torch.cat(outs)


def _prompt_sharing_hidden(config: Config, policy: torch.nn.Module, critic) -> int:
    """The hidden size that lets micro-batches share prompts (``batching``), or 0: sharing
    needs a 4-D attention mask, which eager and SDPA attention take and flash kernels do not."""
    model_config = getattr(policy, "config", None)
    if not config.learner.share_prompts:
        return 0
    if not can_share_prompts(model_config):
        if has_sliding_window(model_config):
            log.info("learner.share_prompts is off for this model: it has sliding-window layers")
        return 0
    return int(model_config.hidden_size)


class TrainStep:
    """Turns a rank's groups into optimizer updates of ``policy`` (and the critic).

    Collective: every rank calls it at the same step with its own groups (the same number).
    """

    def __init__(
        self,
        config: Config,
        policy: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        device: torch.device,
        world_size: int,
        pad_id: int,
        compute_dtype: torch.dtype,
        ref_model: torch.nn.Module | None = None,
        critic=None,
        kl_controller: kl_lib.KLController | None = None,
    ) -> None:
        self.config, self.policy, self.optimizer = config, policy, optimizer
        self.compute_dtype = compute_dtype  # the forward's (fsdp.shard_for_training)
        self.device, self.world_size, self.pad_id = device, world_size, pad_id
        self.ref_model, self.critic = ref_model, critic
        self.kl_controller = kl_controller or kl_lib.FixedController(0.0)
        self.entropy_control = EntropyControl.from_config(config.algorithm)
        teachers = [r.teacher for r in config.rewards if r.teacher is not None]
        self.distills = bool(teachers)
        self.distills_top_k = any(t.top_k for t in teachers)
        self.lagged_teacher = any(t.lagged for t in teachers)
        self.skipped_steps = 0
        self.share_prompts_hidden = _prompt_sharing_hidden(config, policy, critic)

    def coefficients(self) -> dict[str, float]:
        """The adaptive coefficients a checkpoint keeps beside the weights."""
        return {"kl_coef": self.kl_controller.value, "entropy_coef": self.entropy_control.value}

    def restore_coefficients(self, extra: dict) -> None:
        """Adopt the coefficients of a checkpoint's ``extra`` (one saved before a coefficient
        existed leaves it at the config's)."""
        if "kl_coef" in extra:
            self.kl_controller.restore(extra["kl_coef"])
        if "entropy_coef" in extra:
            self.entropy_control.restore(extra["entropy_coef"])

    # ------------------------------------------------------------------ the step

    def __call__(self, groups: list[TrajectoryGroup], version: int) -> dict[str, float]:
        lc, start = self.config.learner, time.perf_counter()
        minis = self._micro_batches(split_groups(groups, lc.mini_batches))
        batches = [b for mini in minis for b in mini]
        metrics = StepMetrics(self.device)
        batch_figures(groups, version, metrics, lagged_teacher=self.lagged_teacher)
        scores = self._scores(groups, batches, metrics)
        self._set_advantages(
            batches, scores, [i for i, g in enumerate(groups) for _ in g.trajectories]
        )
        self._add_distillation(batches, metrics)
        denominators = self._denominators(minis)
        for batch in batches:
            batch.to(self.device)
        updates = lc.ppo_epochs * lc.mini_batches
        if updates > 1:
            self._start_pass(batches, version, metrics)
        self._set_lr(version)
        for _epoch in range(lc.ppo_epochs):
            for mini, denominator in zip(minis, denominators, strict=True):
                for i, batch in enumerate(mini):
                    # Reduce-scatter gradients once per update, not per micro-batch.
                    set_gradient_sync(self.trained_modules, i == len(mini) - 1)
                    self._micro_step(batch, denominator, version, updates == 1, metrics)
                self._optimizer_step(version, metrics)
        out = metrics.reduce()
        for k in range(STALENESS_BINS):
            if out.get(staleness_bin(k)) == 0.0:
                del out[staleness_bin(k)]
        for name in (
            "loss/total",
            "policy/pg_loss",
            "critic/value_loss",
            "train/grad_norm",
            "critic/grad_norm",
        ):
            if name in out:
                out[name] /= updates  # summed over updates: report the mean update
        out.update(self._step_figures(groups, out, updates, start))
        return out

    @torch.no_grad()
    def response_tokens(self, groups: list[TrajectoryGroup]) -> tuple[torch.Tensor, torch.Tensor]:
        """Every trained response token's logprob and entropy under the current weights, at its
        sampling temperature: two flat float32 tensors in the groups' order, the same for any
        micro-batching (``streamrl replay`` compares arms token by token). Collective."""
        batches = self._micro_batches([groups])[0]
        rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for batch in batches:
            batch.to(self.device)
            logprobs, _, entropy = self._policy_logprobs(batch)
            keep = batch.mask.bool().to(self.device)
            for i, row in enumerate(batch.rows.tolist()):
                rows[row] = (logprobs[i][keep[i]].float().cpu(), entropy[i][keep[i]].float().cpu())
        reshard(self.policy)  # no backward follows this forward
        ordered = [rows[r] for r in sorted(rows)]
        return torch.cat([lp for lp, _ in ordered]), torch.cat([e for _, e in ordered])

    # ------------------------------------------------------------------ before the updates

    def _micro_batches(self, parts: list[list[TrajectoryGroup]]) -> list[list[MicroBatch]]:
        """Each mini-batch's micro-batches, as many on every rank: each forward and backward
        under FSDP2 is collective (one all-reduce of the counts, with more than one rank)."""
        lc = self.config.learner
        lengths = [
            [t.num_prompt_tokens + t.num_response_tokens for g in part for t in g.trajectories]
            for part in parts
        ]
        plans = [micro_batch_rows(n, lc.micro_batch_size, lc.micro_batch_tokens) for n in lengths]
        if self.world_size > 1:
            # The most micro-batches any rank planned, capped by the fewest rows any rank has.
            local = torch.tensor(
                [[len(plan), -len(n)] for plan, n in zip(plans, lengths, strict=True)],
                dtype=torch.int64,
                device=self.device,
            )
            agreed = all_reduce(local, dist.ReduceOp.MAX).cpu().tolist()
            plans = [
                resize_plan(plan, n, min(most, -fewest_rows))
                for plan, n, (most, fewest_rows) in zip(plans, lengths, agreed, strict=True)
            ]
        minis, first_row = [], 0
        for part, plan, n in zip(parts, plans, lengths, strict=True):
            minis.append(
                build_micro_batches(
                    part,
                    lc.micro_batch_size,
                    self.pad_id,
                    plan=plan,
                    first_row=first_row,
                    share_prompts_hidden=self.share_prompts_hidden,
                )
            )
            first_row += len(n)
        return minis

    def _scores(
        self, groups: list[TrajectoryGroup], batches: list[MicroBatch], metrics: StepMetrics
    ) -> torch.Tensor:
        alg, gen = self.config.algorithm, self.config.generator
        rewards = torch.tensor([t.reward for g in groups for t in g.trajectories])
        metrics.add("reward/sum", rewards.sum())
        metrics.add("train/samples", float(rewards.numel()))
        metrics.max("reward/max", rewards.max())
        scores = rewards.clone()
        if alg.overlong_buffer.length > 0:
            # Per policy turn, the only thing max_new_tokens caps: an episode's environment
            # tokens and its other turns would penalise tool use (docs/algorithms.md).
            lengths = torch.tensor(
                [
                    shaping.longest_policy_turn(t.action_mask, t.num_response_tokens)
                    for g in groups
                    for t in g.trajectories
                ]
            )
            scores += shaping.overlong_penalty(
                lengths, gen.max_new_tokens, alg.overlong_buffer.length, alg.overlong_buffer.penalty
            )
        if self.ref_model is not None:
            self._ref_pass(batches)
            if alg.kl.in_reward:
                # KL(behaviour || reference) summed over each response (InstructGPT-style).
                seq_kl = in_step_order(
                    batches,
                    [
                        (kl_lib.estimate(b.behavior, b.ref_logprobs, alg.kl.kind) * b.mask).sum(-1)
                        for b in batches
                    ],
                )
                scores = scores - self.kl_controller.value * seq_kl
                tokens = sum(b.mask.sum() for b in batches)
                metrics.mean("kl/ref", seq_kl.sum() / tokens.clamp(min=1), tokens)
        return scores

    @torch.no_grad()
    def _ref_pass(self, batches: list[MicroBatch]) -> None:
        for batch in batches:
            _, batch.ref_logprobs = self._logprobs(self.ref_model, batch)
            batch.ref_logprobs = batch.ref_logprobs.float().cpu()

    def _set_advantages(
        self, batches: list[MicroBatch], scores: torch.Tensor, group_ids: list[int]
    ) -> None:
        """Group advantages ([B] per micro-batch), or GAE from the critic ([B, T])."""
        alg = self.config.algorithm
        if self.critic is None:
            extra = {"std_floor": alg.std_floor} if alg.advantage == "grpo" else {}
            advantages = adv.ADVANTAGES[alg.advantage](scores, torch.tensor(group_ids), **extra)
            for batch in batches:
                batch.advantages = advantages[batch.rows]
            return
        for batch in batches:
            part = scores[batch.rows]
            with torch.no_grad():
                values = self._values(batch).float().cpu()
            rewards = shaping.token_level_rewards(part, batch.mask)
            batch.advantages, batch.returns = adv.gae(
                rewards, values, batch.mask, gamma=alg.gamma, lam=alg.lam
            )
            batch.old_values = values
        # PPO's whitening, over every rank's response tokens (split-invariant).
        flat = torch.cat([b.advantages[b.mask.bool()] for b in batches]).to(self.device)
        sum_ranks = all_reduce if self.world_size > 1 else None
        whitened = adv.masked_whiten(flat, torch.ones_like(flat), all_reduce=sum_ranks).cpu()
        counts = [int(b.mask.sum()) for b in batches]
        for batch, part in zip(batches, whitened.split(counts), strict=True):
            batch.advantages = torch.zeros_like(batch.mask)
            batch.advantages[batch.mask.bool()] = part.float()

    def _add_distillation(self, batches: list[MicroBatch], metrics: StepMetrics) -> None:
        """Each teacher-scored token's advantage gains ``coef * (teacher - behaviour)``
        (``advantages.distill``), after the reward's advantage is made (and whitened, with
        GAE): the teacher's term keeps its own scale beside the reward's."""
        if not self.distills:
            return
        for batch in batches:
            if batch.teacher is None:  # every rank adds the same names (``StepMetrics``)
                metrics.mean("distill/reverse_kl", 0.0, torch.zeros(()))
                metrics.add("distill/tokens", 0.0)
                continue
            assert batch.teacher_coef is not None and batch.advantages is not None
            scored = batch.mask * (batch.teacher_coef[:, None] > 0)
            term = adv.distill(batch.teacher, batch.behavior, batch.teacher_coef, scored)
            base = batch.advantages
            batch.advantages = (base[:, None] if base.dim() == 1 else base) + term
            tokens = scored.sum()
            kl = ((batch.behavior - batch.teacher) * scored).sum() / tokens.clamp(min=1)
            metrics.mean("distill/reverse_kl", kl, tokens)
            metrics.add("distill/tokens", tokens)

    def _denominators(self, minis: list[list[MicroBatch]]) -> list[torch.Tensor]:
        """Per mini-batch, the global count of response tokens (``token-mean``) or of
        non-empty sequences (the ``seq-*`` modes): one all-reduce for all of them."""
        counts = torch.tensor(
            [
                [
                    float(sum(b.mask.sum() for b in mini)),
                    float(sum((b.mask.sum(-1) > 0).sum() for b in mini)),
                ]
                for mini in minis
            ],
            dtype=torch.float64,
        ).to(self.device)
        counts = all_reduce(counts)
        column = 0 if self.config.algorithm.loss_agg == "token-mean" else 1
        return list(counts[:, column].clamp(min=1))

    @torch.no_grad()
    def _start_pass(self, batches: list[MicroBatch], version: int, metrics: StepMetrics) -> None:
        """Logprobs at the step's starting weights: the proximal policy of decoupled PPO, and
        the learner side of the mismatch metrics."""
        for batch in batches:
            _, logprobs = self._logprobs(self.policy, batch)
            batch.proximal = logprobs.float()  # stays on the device for the updates
            mismatch_figures(batch, batch.proximal, version, metrics)
        reshard(self.policy)  # no backward follows this forward to free the gathered params

    # ------------------------------------------------------------------ one micro-batch

    def _micro_step(
        self,
        batch: MicroBatch,
        denominator: torch.Tensor,
        version: int,
        only_update: bool,
        metrics: StepMetrics,
    ) -> None:
        alg, dev = self.config.algorithm, self.device
        norm_length = float(self.config.generator.max_new_tokens)
        # The sampled tokens' logprobs, the entropy and a top-k teacher's tokens' logprobs
        # from one pass over the vocabulary: one softmax forward and one backward.
        logprobs, top_logprobs, entropy = self._policy_logprobs(batch)
        mask, behavior = batch.mask.to(dev), batch.behavior.to(dev)
        tokens = mask.sum()

        def aggregate(per_token: torch.Tensor) -> torch.Tensor:
            """The reduction rule of the module doc: ``loss_agg``, global denominator."""
            return losses.aggregate(
                per_token, mask, alg.loss_agg, norm_length=norm_length, denominator=denominator
            )

        if only_update:  # these weights are the step's starting weights
            mismatch_figures(batch, logprobs.detach(), version, metrics)
        if alg.proximal == "behavior":
            proximal = behavior  # the bypass variant: correction weight 1
        elif batch.proximal is not None:
            proximal = batch.proximal.to(dev)
        else:
            proximal = logprobs.detach()  # one update: the current weights are the proximal
        if batch.guided is not None:
            # A reference response was never sampled: its behaviour is taken to be the
            # proximal policy (correction weight 1; under the bypass, the current weights).
            guided = batch.guided.to(dev)[:, None]
            if alg.proximal == "behavior":
                proximal = torch.where(guided, logprobs.detach(), proximal)
            behavior = torch.where(guided, proximal, behavior)
        advantages = batch.advantages.to(dev)
        loss, policy_metrics = losses.policy_loss(
            logprobs,
            proximal,
            behavior,
            advantages[:, None] if advantages.dim() == 1 else advantages,
            mask,
            clip_low=alg.clip_low,
            clip_high=alg.clip_high,
            dual_clip=alg.dual_clip,
            correction=alg.correction,
            is_cap=alg.is_cap,
            is_low=alg.is_low,
            agg=alg.loss_agg,
            norm_length=norm_length,
            agg_denominator=denominator,
        )
        metrics.add("policy/pg_loss", loss)
        for name, value in policy_metrics.items():
            if name.endswith("_max"):
                metrics.max(name, value)
            else:
                metrics.mean(name, value, tokens)
        if self.ref_model is not None and not alg.kl.in_reward:
            kl = kl_lib.estimate(logprobs, batch.ref_logprobs.to(dev), alg.kl.kind)
            loss = loss + self.kl_controller.value * aggregate(kl)
            metrics.mean("kl/ref", losses.aggregate(kl.detach(), mask, "token-mean"), tokens)
        entropy_coef = self.entropy_control.value
        if entropy_coef <= 0:  # tracked every step all the same: a collapse shows in it first
            entropy = entropy.detach()
        batch_entropy = losses.aggregate(entropy.detach(), mask, "token-mean")
        if entropy_coef > 0:
            bonus = entropy_coef * aggregate(entropy)
            if self.entropy_control.gated:  # on device: no host sync per micro-batch
                bonus = bonus * (batch_entropy < self.entropy_control.target)
            loss = loss - bonus
        metrics.mean("policy/entropy", batch_entropy, tokens)
        if self.distills_top_k:
            loss = loss + self._top_k_term(batch, top_logprobs, aggregate, metrics)
        if self.critic is not None:
            value_loss = losses.value_loss(
                self._values(batch),
                batch.returns.to(dev),
                batch.old_values.to(dev),
                mask,
                clip=alg.value_clip,
                agg=alg.loss_agg,
                norm_length=norm_length,
                agg_denominator=denominator,
            )
            loss = loss + alg.value_coef * value_loss
            metrics.add("critic/value_loss", value_loss)
        (loss * self.world_size).backward()
        metrics.add("loss/total", loss)

    def _top_k_term(
        self,
        batch: MicroBatch,
        student: torch.Tensor | None,
        aggregate: Callable[[torch.Tensor], torch.Tensor],
        metrics: StepMetrics,
    ) -> torch.Tensor:
        """A top-k teacher's forward KL over its k tokens at each position (``student``: the
        policy's logprobs of them), weighted per row (``losses.distill_topk``), aggregated as
        every loss term; 0 without one. Every rank adds the same metric names."""
        if student is None:
            metrics.mean("distill/forward_kl_top_k", 0.0, torch.zeros(()))
            return torch.zeros((), device=self.device)
        dev = student.device
        assert batch.teacher_top_logprobs is not None and batch.teacher_top_coef is not None
        teacher = batch.teacher_top_logprobs.to(dev)
        coef = batch.teacher_top_coef.to(dev)
        per_token = losses.distill_topk(student, teacher)
        scored = batch.mask.to(dev) * (coef[:, None] > 0)
        count = scored.sum()
        kl = (per_token.detach() * scored).sum() / count.clamp(min=1)
        metrics.mean("distill/forward_kl_top_k", kl, count)
        return aggregate(coef[:, None] * per_token * scored)

    def _logprobs(
        self, model: torch.nn.Module, batch: MicroBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, T, V], logprobs [B, T]) of each response token; the logprobs at each
        response's sampling temperature, the logits unscaled (layouts: ``batching``)."""
        logits = self._logits(model, batch)
        return logits, at_sampling_temperature(losses.token_logprobs, batch, logits, batch.targets)

    def _logits(self, model: torch.nn.Module, batch: MicroBatch) -> torch.Tensor:
        """The forward's logits [B, T, V] that predict each response token, unscaled."""
        inputs = batch.model_inputs(self.compute_dtype)
        return batch.gather(model(**inputs, logits_to_keep=batch.keep).logits)

    def _policy_logprobs(
        self, batch: MicroBatch
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """The policy's logprobs of the sampled tokens ([B, T]), of a top-k teacher's k tokens
        at each position ([B, T, k], None without one) and its entropy ([B, T]), all from one
        chunked pass over the vocabulary (``losses.token_logprobs_and_entropy``)."""
        logits = self._logits(self.policy, batch)
        tokens = batch.targets[..., None]
        if batch.teacher_top_ids is not None:
            tokens = torch.cat([tokens, batch.teacher_top_ids], -1)
        both, entropy = at_sampling_temperature(
            losses.token_logprobs_and_entropy, batch, logits, tokens.to(logits.device)
        )
        top = both[..., 1:] if batch.teacher_top_ids is not None else None
        return both[..., 0], top, entropy

    def _values(self, batch: MicroBatch) -> torch.Tensor:
        values = self.critic.values(batch.model_inputs(self.compute_dtype))
        return batch.gather(batch.kept_outputs(values))

    # ------------------------------------------------------------------ updates

    @property
    def trained_modules(self) -> list[torch.nn.Module]:
        """The modules an update changes: the policy, and the critic with GAE."""
        return [self.policy] + ([self.critic.model] if self.critic is not None else [])

    def _set_lr(self, version: int) -> None:
        scale = lr_multiplier(version, self.config)
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.learner.lr * scale
        if self.critic is not None:
            self.critic.set_lr_scale(scale)

    def _optimizer_step(self, version: int, metrics: StepMetrics) -> None:
        norm, stepped = clip_and_step(self.policy, self.optimizer, self.config.learner.grad_clip)
        if self.critic is not None:
            critic_norm, critic_stepped = self.critic.step()
            metrics.add("critic/grad_norm", critic_norm if critic_stepped else 0.0)
            stepped = stepped and critic_stepped
        if not stepped:
            if self.skipped_steps == 0:
                log.warning(
                    "version %d: gradient norm is not finite (%s); update skipped (further "
                    "skips are counted in train/skipped_updates, not logged)",
                    version,
                    norm,
                )
            self.skipped_steps += 1
            norm = torch.zeros(())
        metrics.add("train/grad_norm", norm)

    def _step_figures(
        self, groups: list[TrajectoryGroup], out: dict[str, float], updates: int, start: float
    ) -> dict[str, float]:
        """Figures every rank knows alike, and the adaptive KL and entropy updates (fed the
        step's measured KL and entropy)."""
        samples = out.pop("train/samples")
        figures = {
            "reward/mean": out.pop("reward/sum") / samples,
            "train/updates": float(updates),
            "train/skipped_updates": float(self.skipped_steps),
            "train/lr": self.optimizer.param_groups[0]["lr"],
            "time/step_s": time.perf_counter() - start,
        }
        if "kl/ref" in out:
            self.kl_controller.update(out["kl/ref"], int(samples))
            figures["kl/coef"] = self.kl_controller.value
        figures["policy/entropy_coef"] = self.entropy_control.value  # the one this step used
        if "policy/entropy" in out:
            self.entropy_control.update(out["policy/entropy"])
        return figures
