"""Learner role: one rank of an FSDP2 group that turns staleness-bounded batches into versions.

Loop (waits for -> unblocked by):
  1. its share of the batch (``groups_per_step / ranks`` whole groups, ``min_version >=
     version - max_staleness``)                    -> generators filling the buffer
  2. forward/backward per micro-batch; one AdamW step = one new version
  3. publish its own shard's diff                  -> never waits (PUB drops; anchors repair)

Loss normalisation: every micro-batch loss is divided by the *global* token (or sequence)
count of the step, so the sum over micro-batches and ranks is the whole-batch loss whatever
the padding; FSDP2 averages gradients over ranks, hence the ``* world_size``.

Proximal policy: with one optimizer step per batch the weights at the start of the step *are*
the proximal policy, so ``proximal=recompute`` costs no extra forward (its logprobs are the
detached current ones and the clipped ratio starts at 1); ``proximal=behavior`` uses the
generators' logprobs instead (the "bypass" variant: correction weight 1).
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import time
from pathlib import Path

import msgspec
import torch
import torch.distributed as dist
import zmq

from streamrl.algorithms import advantages as adv
from streamrl.algorithms import kl as kl_lib
from streamrl.algorithms import losses
from streamrl.algorithms import rewards as shaping
from streamrl.buffers.client import BufferClient, FetchStopped
from streamrl.config import Config
from streamrl.models import load_causal_lm, load_tokenizer
from streamrl.protocol import LearnerStep, TrajectoryGroup
from streamrl.transport import make_socket
from streamrl.workers import checkpoint
from streamrl.workers.batching import MicroBatch, build_micro_batches
from streamrl.workers.fsdp import apply_fsdp, clip_and_step
from streamrl.workers.publisher import WeightPublisher

log = logging.getLogger(__name__)


def rendezvous(master: str, rank: int, world_size: int) -> dist.TCPStore:
    """The process group's store at ``master`` (``host:port``), bound to that host only.

    TCPStore's own server listens on every interface, so rank 0 hands it a socket bound to
    ``host``; with a loopback host, gloo's transport is kept on loopback too.
    """
    host, port = master.rsplit(":", 1)
    if host in ("127.0.0.1", "localhost"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    listen_fd = None
    if rank == 0:
        listen_fd = socket.create_server((host, int(port)), backlog=2 * world_size).detach()
    return dist.TCPStore(
        host,
        int(port),
        world_size,
        is_master=rank == 0,
        master_listen_fd=listen_fd,
        timeout=datetime.timedelta(minutes=5),
    )


class Learner:
    def __init__(
        self,
        config: Config,
        rank: int,
        world_size: int,
        master: str,
        model_dir: str,
        shard_endpoints: list[str],
        report_endpoint: str,
        checkpoint_dir: str = "checkpoints",
    ) -> None:
        lc = config.learner
        torch.set_num_threads(lc.threads)
        torch.manual_seed(config.run.seed)
        self.config, self.rank, self.world_size = config, rank, world_size
        self.model_dir = Path(model_dir)
        self.device = torch.device(lc.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device.index or 0)
        dist.init_process_group(
            lc.backend,
            store=rendezvous(master, rank, world_size),
            rank=rank,
            world_size=world_size,
        )
        mesh = dist.device_mesh.init_device_mesh(self.device.type, (world_size,))
        self.model = load_causal_lm(self.model_dir, config.model.learner_dtype, lc.device)
        self.model.config.use_cache = False
        apply_fsdp(self.model, mesh, lc.mp_param_dtype)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=lc.lr, betas=lc.betas, weight_decay=lc.weight_decay
        )
        self.ref_model = None
        if config.algorithm.kl.coef > 0:
            self.ref_model = load_causal_lm(self.model_dir, "bfloat16", lc.device).eval()
            self.ref_model.requires_grad_(False)
        self.critic = None
        if config.algorithm.advantage == "gae":
            from streamrl.workers.critic import Critic

            self.critic = Critic(config, self.model_dir, mesh, self.device)
        self.kl_controller = kl_lib.make_controller(
            config.algorithm.kl.coef,
            config.algorithm.kl.adaptive_target,
            config.algorithm.kl.adaptive_horizon,
        )
        self.pad_id = int(load_tokenizer(self.model_dir).pad_token_id or 0)
        self._checkpoint_requested = False
        self.checkpoint_dir = Path(checkpoint_dir)
        self.version = self._resume() if config.run.resume else 0
        # Created after resuming: its first image (and anchors) are the resumed version.
        self.publisher = WeightPublisher(
            self.model, rank, world_size, config.weights, version=self.version
        )
        self.buffer = BufferClient(
            shard_endpoints, name=f"learner[{rank}]", log_every_s=lc.batch_wait_log_s
        )
        self.ctx = zmq.Context()
        self.reporter = make_socket(self.ctx, zmq.PUSH)
        self.reporter.connect(report_endpoint)
        self.encoder = msgspec.msgpack.Encoder()
        self._stop = False

    def endpoints(self) -> tuple[str, str]:
        return self.publisher.pub_endpoint, self.publisher.anchor_endpoint

    def request_stop(self) -> None:
        self._stop = True

    # ------------------------------------------------------------------ loop

    def run(self, max_steps: int) -> int:
        per_rank = self.config.learner.groups_per_step // self.world_size
        while self.version < max_steps:
            wait_start = time.perf_counter()
            # Read every step: the admin API can change the bound while the run goes on.
            eta = self.config.buffer.max_staleness
            groups = self._fetch(per_rank, self.version - eta)
            if not self._every_rank_has_a_batch(groups is not None):
                break  # stopped (request_stop), on every rank at the same step
            assert groups is not None
            wait_s = time.perf_counter() - wait_start
            metrics = self.train_step(groups)
            self.version += 1
            metrics.update(self.publisher.publish(self.version))
            metrics["time/wait_batch_s"] = wait_s
            if self._checkpoint_due():
                self.save_checkpoint()
                metrics["checkpoint/version"] = float(self.version)
            if self.rank == 0:
                self.reporter.send(
                    self.encoder.encode(LearnerStep(self.version, metrics, time.time()))
                )
        return self.version

    def _fetch(self, k: int, floor: int) -> list[TrajectoryGroup] | None:
        """This rank's batch, or ``None`` once a stop was requested. A stop leaves a fetch that
        holds no group at once, and one that holds some after the client's grace period (the
        groups are then lost: they already left the buffer)."""
        try:
            return self.buffer.fetch(k, floor, self.version, should_stop=lambda: self._stop)
        except FetchStopped:
            return None

    def _every_rank_has_a_batch(self, has_batch: bool) -> bool:
        """Collective (one scalar all-reduce when ranks > 1): ranks hear a stop at different
        moments, so a rank trains only if every rank has its batch, and all stop together
        (the batches some ranks fetched at that step are dropped)."""
        if self.world_size == 1:
            return has_batch
        flag = torch.tensor([float(has_batch)], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    # ------------------------------------------------------------------ checkpoints

    def _modules(self) -> checkpoint.Modules:
        modules = {"policy": (self.model, self.optimizer)}
        if self.critic is not None:
            modules["critic"] = (self.critic.model, self.critic.optimizer)
        return modules

    def request_checkpoint(self) -> None:
        self._checkpoint_requested = True

    def _checkpoint_due(self) -> bool:
        # Ranks hear a request at different moments: agree (one scalar all-reduce) on the step.
        every = self.config.run.checkpoint_every
        due = self._checkpoint_requested or (every > 0 and self.version % every == 0)
        flag = torch.tensor([float(due)], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def save_checkpoint(self) -> Path:
        """Collective: every rank saves its shards of the policy/critic and optimizers."""
        self._checkpoint_requested = False
        return checkpoint.save(self._modules(), self.checkpoint_dir, self.version)

    def final_checkpoint(self) -> Path:
        """Collective: save unless the newest checkpoint already holds this version."""
        path = checkpoint.latest(self.checkpoint_dir)
        if path == checkpoint.path_for(self.checkpoint_dir, self.version):
            return path
        return self.save_checkpoint()

    def _resume(self) -> int:
        """Load the newest checkpoint, if any (collective); returns the version to go on from."""
        path = checkpoint.latest(self.checkpoint_dir)
        if path is None:
            return 0
        version = checkpoint.load(self._modules(), path)
        log.info("learner[%d]: resumed from %s (version %d)", self.rank, path, version)
        return version

    # ------------------------------------------------------------------ training

    def train_step(self, groups: list[TrajectoryGroup]) -> dict[str, float]:
        alg, start = self.config.algorithm, time.perf_counter()
        rewards = torch.tensor([t.reward for g in groups for t in g.trajectories])
        group_ids = torch.tensor([i for i, g in enumerate(groups) for _ in g.trajectories])
        batches = build_micro_batches(
            groups, torch.zeros_like(rewards), self.config.learner.micro_batch_size, self.pad_id
        )
        scores, sums = rewards, {}
        if self.ref_model is not None and alg.kl.in_reward:
            seq_kl = self._sequence_kl(batches)
            scores = rewards - self.kl_controller.value * seq_kl
            # Per-token KL, in the same units as the in-loss metric (sums are averaged later).
            tokens = sum(b.mask.sum() for b in batches).clamp(min=1)
            sums["kl/ref"] = (seq_kl.sum() / tokens).double() * len(batches)
        self._set_advantages(batches, scores, group_ids)
        # Global denominators so micro-batch losses sum to the whole-batch loss (see module doc).
        counts = torch.tensor(
            [sum(b.mask.sum() for b in batches), sum((b.mask.sum(-1) > 0).sum() for b in batches)],
            dtype=torch.float64,
        ).to(self.device)
        dist.all_reduce(counts)
        denominator = counts[1] if alg.loss_agg.startswith("seq") else counts[0]
        for batch in batches:
            for key, value in self._micro_step(batch, denominator).items():
                sums[key] = sums.get(key, 0.0) + value.detach().double()
        grad_norm = clip_and_step(self.model, self.optimizer, self.config.learner.grad_clip)
        if self.critic is not None:
            sums["critic/grad_norm"] = self.critic.step().double().cpu() * len(batches)
        return self._reduce_metrics(groups, rewards, sums, len(batches), grad_norm, start)

    def _set_advantages(
        self, batches: list[MicroBatch], scores: torch.Tensor, group_ids: torch.Tensor
    ) -> None:
        """Group advantages ([B] per micro-batch), or GAE from the critic ([B, T-1])."""
        alg = self.config.algorithm
        sizes = [len(b.advantages) for b in batches]
        if self.critic is None:
            advantages = adv.ADVANTAGES[alg.advantage](scores, group_ids)
            for batch, part in zip(batches, advantages.split(sizes), strict=True):
                batch.advantages = part
            return
        for batch, part in zip(batches, scores.split(sizes), strict=True):
            ids = batch.input_ids.to(self.device)
            with torch.no_grad():
                values = self.critic.values(ids, (ids != self.pad_id).long()).cpu()
            rewards = shaping.token_level_rewards(part, batch.mask)
            batch.advantages, batch.returns = adv.gae(
                rewards, values, batch.mask, gamma=alg.gamma, lam=alg.lam
            )
            batch.old_values = values
        # Whiten over every response token of this rank (PPO's usual normalisation).
        flat = torch.cat([b.advantages[b.mask.bool()] for b in batches])
        mean, std = flat.mean(), flat.std() if flat.numel() > 1 else torch.tensor(1.0)
        for batch in batches:
            batch.advantages = (batch.advantages - mean) / (std + 1e-8) * batch.mask

    @torch.no_grad()
    def _sequence_kl(self, batches: list[MicroBatch]) -> torch.Tensor:
        """KL(behaviour || reference) summed over each response: the in-reward penalty
        (Ziegler et al. 2019 / InstructGPT), subtracted from the score before advantages."""
        kind, out = self.config.algorithm.kl.kind, []
        for batch in batches:
            ids = batch.input_ids.to(self.device)
            logits = self.ref_model(input_ids=ids, attention_mask=(ids != self.pad_id).long())
            ref = losses.token_logprobs(
                logits.logits[:, :-1] / batch.temperatures.to(self.device)[:, None, None],
                ids[:, 1:],
            )
            kl = kl_lib.estimate(batch.behavior.to(self.device), ref, kind)
            out.append((kl * batch.mask.to(self.device)).sum(-1).cpu())
        return torch.cat(out)

    def _micro_step(self, batch: MicroBatch, denominator: torch.Tensor) -> dict[str, torch.Tensor]:
        alg = self.config.algorithm
        ids = batch.input_ids.to(self.device)
        attention = (ids != self.pad_id).long()
        logits = self.model(input_ids=ids, attention_mask=attention).logits[:, :-1]
        # Score each response at the temperature it was sampled with (it can change live).
        temperature = float(batch.temperatures[0])
        if not bool((batch.temperatures == temperature).all()):
            logits = logits / batch.temperatures.to(logits)[:, None, None]
            temperature = 1.0
        logprobs = losses.token_logprobs(
            logits, batch.targets.to(self.device), temperature=temperature
        )
        mask = batch.mask.to(self.device)
        behavior = batch.behavior.to(self.device)
        proximal = logprobs.detach() if alg.proximal == "recompute" else behavior
        advantages = batch.advantages.to(self.device)
        loss, metrics = losses.policy_loss(
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
            agg_denominator=denominator,
        )
        if self.ref_model is not None and not alg.kl.in_reward:
            with torch.no_grad():
                ref_logits = self.ref_model(input_ids=ids, attention_mask=attention).logits[:, :-1]
                ref = losses.token_logprobs(ref_logits, ids[:, 1:], temperature=temperature)
            kl = kl_lib.estimate(logprobs, ref, alg.kl.kind)
            kl_loss = losses.aggregate(kl, mask, alg.loss_agg, denominator=denominator)
            loss = loss + self.kl_controller.value * kl_loss
            metrics["kl/ref"] = kl_loss.detach()
        if alg.entropy_coef > 0:
            ent = losses.entropy(logits, mask, temperature=temperature)
            loss = loss - alg.entropy_coef * ent
            metrics["policy/entropy"] = ent
        if self.critic is not None:
            values = self.critic.values(ids, attention)
            value_loss = losses.value_loss(
                values,
                batch.returns.to(self.device),
                batch.old_values.to(self.device),
                mask,
                clip=alg.value_clip,
                agg=alg.loss_agg,
                agg_denominator=denominator,
            )
            loss = loss + alg.value_coef * value_loss
            metrics["critic/value_loss"] = value_loss.detach()
        (loss * self.world_size).backward()
        metrics["loss/total"] = loss
        return metrics

    def _reduce_metrics(
        self, groups, rewards, sums, n_batches, grad_norm, start
    ) -> dict[str, float]:
        staleness = torch.tensor([float(self.version - g.min_version) for g in groups])
        tokens = sum(t.num_response_tokens for g in groups for t in g.trajectories)
        names = sorted(sums)
        # One all-reduce for sums, one for maxima: metrics cost two collectives per step.
        total = torch.stack(
            [
                rewards.sum().double(),
                torch.tensor(float(rewards.numel()), dtype=torch.float64),
                staleness.sum().double(),
                torch.tensor(float(len(groups)), dtype=torch.float64),
                torch.tensor(float(tokens), dtype=torch.float64),
            ]
            + [(sums[n] / n_batches).cpu() for n in names]
        ).to(self.device)
        dist.all_reduce(total)
        peak = torch.stack([staleness.max().double(), rewards.max().double()]).to(self.device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        out = {
            "reward/mean": float(total[0] / total[1]),
            "reward/max": float(peak[1]),
            "staleness/mean": float(total[2] / total[3]),
            "staleness/max": float(peak[0]),
            "train/response_tokens": float(total[4]),
            "train/grad_norm": float(grad_norm),
            "train/lr": self.optimizer.param_groups[0]["lr"],
            "time/step_s": time.perf_counter() - start,
        }
        for i, name in enumerate(names):
            value = float(total[5 + i])
            # The loss is already a global sum; the rest are per-rank means -> mean over ranks.
            out[name] = value if name == "loss/total" else value / self.world_size
        if "kl/ref" in out:
            self.kl_controller.update(out["kl/ref"], 1)
            out["kl/coef"] = self.kl_controller.value
        return out

    # ------------------------------------------------------------------ export

    def export_hf(self, out_dir: str) -> None:
        """Gather the full model (collective: every rank calls it) and save bf16 on rank 0."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(
            self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if self.rank == 0:
            state = {k: v.to(torch.bfloat16) for k, v in state.items()}
            self.model.config.use_cache = True
            self.model.config.dtype = torch.bfloat16
            self.model.save_pretrained(out_dir, state_dict=state, safe_serialization=True)
            load_tokenizer(self.model_dir).save_pretrained(out_dir)
        dist.barrier()

    def close(self) -> None:
        self.publisher.close()
        self.buffer.close()
        self.ctx.destroy(linger=0)
        if dist.is_initialized():
            dist.destroy_process_group()
