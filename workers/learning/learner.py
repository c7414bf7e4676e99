"""Learner role: one rank of an FSDP2 group that turns staleness-bounded batches into versions.

Loop (waits for -> unblocked by):
  1. its share of the batch (``groups_per_step / ranks`` whole groups, ``min_version >=
     version - max_staleness``)                    -> generators filling the buffer
  2. the training step (``train_step.TrainStep``: losses, PPO updates, metrics) = one version
  3. publish its own shard's diff                  -> never waits (PUB drops; anchors repair)

This module is the role: process group, models and their placement, fetch, publish,
checkpoint, export. What a step computes lives in ``train_step``.
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

from streamrl.algorithms import kl as kl_lib
from streamrl.buffers.client import BufferClient, FetchStopped
from streamrl.config import Config
from streamrl.cores import role_threads
from streamrl.hardware import describe_choice, resolve_compute_dtype
from streamrl.models import load_causal_lm, load_tokenizer
from streamrl.models.lora import adapter_settings, attach_adapter
from streamrl.protocol import BatchTaken, LearnerStep, TrajectoryGroup
from streamrl.role_specs import LearnerSpec
from streamrl.transport import interface_holding, make_socket, resolve_host
from streamrl.workers.learning import checkpoint
from streamrl.workers.learning.fsdp import adamw, offer_compute_image, shard_for_training
from streamrl.workers.learning.lora_forward import merge_in_forward
from streamrl.workers.learning.publisher import WeightPublisher
from streamrl.workers.learning.shard_image import whole_tensors
from streamrl.workers.learning.train_step import TrainStep
from streamrl.workers.learning.training_record import NoRecord, TrainingRecord

log = logging.getLogger(__name__)


def group_listener(host: str, world_size: int) -> socket.socket:
    """Rank 0's store socket, bound now to a free port on ``host``.

    Binding when the port is chosen leaves no window for another process to take it between
    the choice and the store's start (a port picked free and bound later was taken that way).
    """
    return socket.create_server((host, 0), backlog=2 * world_size)


def rendezvous(
    master: str, rank: int, world_size: int, listener: socket.socket | None = None
) -> dist.TCPStore:
    """The process group's store at ``master`` (``host:port``), bound to that host only.

    TCPStore's own server listens on every interface, so rank 0 hands it a socket bound to
    ``host``: ``listener`` (``group_listener``) where rank 0 bound it already, else one bound
    here (port 0 takes any free port: enough for a group of one). Another rank given the
    listener (its copy in a process spawned with it) closes that copy: rank 0's store alone
    serves on it. With a loopback host, gloo's transport is kept on loopback too (forced: a
    ``GLOO_SOCKET_IFNAME`` exported for a cluster must not put a local run's group on it).
    """
    host, port = master.rsplit(":", 1)
    if host in ("127.0.0.1", "localhost"):
        os.environ["GLOO_SOCKET_IFNAME"] = interface_holding(host) or "lo"
    listen_fd = None
    if rank != 0 and listener is not None:
        listener.close()
    if rank == 0:
        server = listener or socket.create_server((host, int(port)), backlog=2 * world_size)
        port = str(server.getsockname()[1])
        listen_fd = server.detach()
    return dist.TCPStore(
        host,
        int(port),
        world_size,
        is_master=rank == 0,
        master_listen_fd=listen_fd,
        timeout=datetime.timedelta(minutes=5),
    )


# Longest sequence (prompt + response tokens) for which a CPU learner computes attention
# eagerly: SmolLM2 forward + backward, 1 thread, eager against SDPA: 16 x 53 tokens 1.95 s vs
# 2.40 s, 8 x 200 3.62 s vs 4.03 s, but 2 x 512 3.07 s vs 2.70 s (SDPA's CPU flash backward
# has a high fixed cost that long sequences amortise).
EAGER_ATTENTION_MAX_TOKENS = 256


def training_attention(config: Config, device: torch.device) -> str | None:
    """The attention implementation the learner's models use; None keeps the model's own."""
    longest = config.data.max_prompt_tokens + config.generator.max_new_tokens
    if device.type == "cpu" and longest <= EAGER_ATTENTION_MAX_TOKENS:
        return "eager"
    return None


def build_train_step(
    config: Config,
    model_dir: Path,
    device: torch.device,
    world_size: int,
    compute_dtype: str | None = None,
    adapter_dir: Path | None = None,
) -> TrainStep:
    """Load and shard the models one training step needs (collective: inside the process
    group): the policy and its AdamW, the frozen reference (KL), the critic (GAE).
    ``compute_dtype``: the role's, resolved once (None: resolved here from the config).
    ``adapter_dir``: LoRA, version 0 of the adapters (``streamrl.models.lora``); only they train."""
    lc = config.learner
    mesh = dist.device_mesh.init_device_mesh(device.type, (world_size,))
    compute = compute_dtype or resolve_compute_dtype(config.model.compute_dtype, str(device))
    # LoRA: the frozen base is loaded in the compute dtype (its bf16 checkpoint values are
    # exact in either), the adapters' masters in the learner dtype.
    base_dtype = compute if adapter_dir is not None else config.model.learner_dtype
    policy = load_causal_lm(model_dir, base_dtype, str(device))
    policy.config.use_cache = False
    attention = training_attention(config, device)
    if attention is not None:
        policy.set_attn_implementation(attention)
    if lc.activation_checkpointing:
        policy.gradient_checkpointing_enable({"use_reentrant": False})
    if adapter_dir is not None:
        settings = adapter_settings(config)
        policy = attach_adapter(policy, adapter_dir, settings, trainable=True)
        if settings.dropout == 0:  # dropout acts on the adapters' input: unmerged only
            merge_in_forward(policy)
        policy.to(device)
        for param in policy.parameters():
            if param.requires_grad:
                param.data = param.data.to(getattr(torch, config.model.learner_dtype))
    shard_for_training(policy, mesh, compute)
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = adamw(trainable, lc.lr, lc.betas, lc.weight_decay, device)
    ref_model = None
    if config.algorithm.kl.coef > 0:
        # Frozen, sharded like the policy, no KV cache; its bf16 checkpoint values are exact
        # in either compute dtype, so it needs no rounding.
        ref_model = load_causal_lm(model_dir, compute, str(device)).eval()
        ref_model.config.use_cache = False
        ref_model.requires_grad_(False)
        if attention is not None:
            ref_model.set_attn_implementation(attention)
        shard_for_training(ref_model, mesh, compute, round_to_bf16=False)
    critic = None
    if config.algorithm.advantage == "gae":
        from streamrl.workers.learning.critic import Critic

        critic = Critic(config, model_dir, mesh, device, compute)
    kl = config.algorithm.kl
    return TrainStep(
        config,
        policy,
        optimizer,
        device=device,
        world_size=world_size,
        pad_id=int(load_tokenizer(model_dir).pad_token_id or 0),
        compute_dtype=getattr(torch, compute),
        ref_model=ref_model,
        critic=critic,
        kl_controller=kl_lib.make_controller(kl.coef, kl.adaptive_target, kl.adaptive_horizon),
    )


class Learner:
    def __init__(
        self, spec: LearnerSpec, master: str, listener: socket.socket | None = None
    ) -> None:
        """``spec``: the rank's whole wiring (``role_specs.LearnerSpec``); ``master``: rank 0's
        rendezvous address (``host:port``), known only once rank 0 is placed; ``listener``:
        rank 0's socket already bound to it (``group_listener``). The spec's
        ``incarnation`` and ``forks`` are the learner clock's epoch and the versions its
        epochs resumed at (``streamrl.clock``); every report and buffer request carries them."""
        config, rank, world_size = spec.config, spec.rank, spec.world_size
        incarnation = spec.incarnation
        lc = config.learner
        self.incarnation = incarnation  # restarts of the group so far: on every report
        # The controller resolves threads (0 = auto); a role built directly resolves its own.
        self.threads = role_threads(config, "learner", None, len(os.sched_getaffinity(0)))
        torch.set_num_threads(self.threads)
        torch.manual_seed(config.run.seed)
        self.config, self.rank, self.world_size = config, rank, world_size
        self.model_dir = Path(spec.model_dir)
        self.device = torch.device(lc.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device.index or 0)
        dist.init_process_group(
            lc.backend,
            store=rendezvous(master, rank, world_size, listener),
            rank=rank,
            world_size=world_size,
        )
        requested = config.model.compute_dtype
        self.compute_dtype = resolve_compute_dtype(requested, lc.device)  # once, for the rank
        if rank == 0:
            log.info("learner: %s", describe_choice(self.compute_dtype, requested, lc.device))
        self.adapter_dir = Path(spec.adapter_dir) if spec.adapter_dir else None
        self.train_step = build_train_step(
            config, self.model_dir, self.device, world_size, self.compute_dtype, self.adapter_dir
        )
        self.model, self.optimizer = self.train_step.policy, self.train_step.optimizer
        self.critic, self.kl_controller = self.train_step.critic, self.train_step.kl_controller
        self._checkpoint_requested = False
        self.checkpoint_dir = Path(spec.checkpoint_dir)
        resumed = self._resume() if config.run.resume else None
        self.version = resumed or 0
        # The group owns its clock: a restarted group's fork is the version it resumed at.
        self.forks = list(spec.forks)
        if len(self.forks) < incarnation:
            self.forks.append(self.version)
        # Created after resuming: its first image (and anchors) are the resumed version.
        self.publisher = WeightPublisher(
            self.model,
            rank,
            world_size,
            config.weights,
            version=self.version,
            host=resolve_host(spec.bind_host),
            ports=(spec.pub_port, spec.anchor_port),
            encoder_cores=spec.encoder_cores,
        )
        self.buffer = BufferClient(
            spec.shard_endpoints,
            name=f"learner[{rank}]",
            log_every_s=lc.batch_wait_log_s,
            epoch=incarnation,
            forks=self.forks,
        )
        # -1: no checkpoint yet, so shards keep no take receipts (nothing could roll back to one).
        self.buffer.checkpointed = -1 if resumed is None else self.version
        self.ctx = zmq.Context()
        self.reporter = make_socket(self.ctx, zmq.PUSH)
        self.reporter.connect(spec.report_endpoint)
        self.encoder = msgspec.msgpack.Encoder()
        self.record = self._open_record(spec)
        self._stop = False

    def _open_record(self, spec: LearnerSpec) -> TrainingRecord | NoRecord:
        """This rank's training record for this epoch (``training_record``)."""
        if not spec.record_run_dir:
            return NoRecord()
        header = {
            "rank": self.rank,
            "world_size": self.world_size,
            "threads": self.threads,
            "compute_dtype": self.compute_dtype,
            "device": self.config.learner.device,
            "model_dir": str(self.model_dir),
            "adapter_dir": str(self.adapter_dir or ""),
            "resumed_at": self.version,
            "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        }
        return TrainingRecord(Path(spec.record_run_dir), self.rank, self.incarnation, header)

    def endpoints(self) -> tuple[str, str]:
        return self.publisher.pub_endpoint, self.publisher.anchor_endpoint

    def request_stop(self) -> None:
        self._stop = True

    # ------------------------------------------------------------------ loop

    def run(self, max_steps: int) -> int:
        # Again on this thread: a Ray actor runs its methods on other threads than __init__,
        # and where libgomp is preloaded OpenMP's thread count does not follow them there.
        torch.set_num_threads(self.threads)
        per_rank = self.config.learner.groups_per_step // self.world_size
        while self.version < max_steps:
            wait_start = time.perf_counter()
            # Read every step: the admin API can change the bound while the run goes on.
            eta = self.config.buffer.max_staleness
            groups = self._fetch(per_rank, self.version - eta)
            if groups is not None:  # before any collective: a dead peer rank would hang it
                indices = [g.prompt_index for g in groups]
                taken = BatchTaken(self.rank, self.version + 1, indices, self.incarnation)
                self.reporter.send(self.encoder.encode(taken))
            if not self._every_rank_has_a_batch(groups is not None):
                break  # stopped (request_stop), on every rank at the same step
            assert groups is not None
            busy_start = time.perf_counter()
            wait_s = busy_start - wait_start
            rng_state = torch.get_rng_state()  # what LoRA dropout draws from: replayed too
            metrics = self.train_step(groups, self.version)
            self.version += 1
            # Before publishing: every version a generator samples with has its row.
            trained = self.train_step.trained_modules
            metrics.update(self.record.record_step(self.version, groups, rng_state, trained, eta))
            # A checkpoint step's weights are verified whole by every generator (/checkpoint).
            every = self.config.run.checkpoint_every
            due = every > 0 and self.version % every == 0
            checkpoint_step = self._checkpoint_requested or due
            metrics.update(self.publisher.publish(self.version, verify=checkpoint_step))
            # The next forward takes the snapshot as its bf16 image instead of casting again.
            offer_compute_image(self.model, whole_tensors(self.publisher.last_snapshot))
            metrics["time/wait_batch_s"] = wait_s
            metrics["train/groups"] = float(len(groups) * self.world_size)  # equal shares
            if self._checkpoint_due():
                self.save_checkpoint()
                metrics["checkpoint/version"] = float(self.version)
            # Training, publishing and checkpointing: the learner's busy time (`streamrl bench`).
            metrics["time/busy_s"] = time.perf_counter() - busy_start
            if self.rank == 0:
                step = LearnerStep(self.version, metrics, time.time(), self.incarnation)
                self.reporter.send(self.encoder.encode(step))
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
        # The clock goes with the weights: a resume starts an epoch above this one.
        extra = {**self.train_step.coefficients(), "epoch": self.incarnation}
        extra["forks"] = list(self.forks)
        path = checkpoint.save(self._modules(), self.checkpoint_dir, self.version, extra)
        self.buffer.checkpointed = self.version
        return path

    def final_checkpoint(self) -> Path:
        """Collective: save unless the newest checkpoint already holds this version."""
        path = checkpoint.latest(self.checkpoint_dir)
        if path == checkpoint.path_for(self.checkpoint_dir, self.version):
            return path
        return self.save_checkpoint()

    def _resume(self) -> int | None:
        """Load the newest checkpoint, if any (collective); returns the version to go on from
        (None: there is none, the run starts over from the base model)."""
        path = checkpoint.latest(self.checkpoint_dir)
        if path is None:
            return None
        version, extra = checkpoint.load(self._modules(), path)
        self.train_step.restore_coefficients(extra)
        log.info("learner[%d]: resumed from %s (version %d)", self.rank, path, version)
        return version

    # ------------------------------------------------------------------ export

    def export_hf(self, out_dir: str) -> None:
        """Gather the full model (collective: every rank calls it) and save bf16 on rank 0.
        LoRA: the adapters go to ``adapter/`` beside ``out_dir``, and ``out_dir`` gets the
        merged model (what the generators ran), so that evaluation reads either alike."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(
            full_state_dict=True,
            cpu_offload=True,
            ignore_frozen_params=self.adapter_dir is not None,
        )
        state = get_model_state_dict(self.model, options=options)
        if self.adapter_dir is not None:  # a tied head may come along with the adapters
            trained = {n for n, p in self.model.named_parameters() if p.requires_grad}
            state = {k: v for k, v in state.items() if k in trained}
        if self.rank == 0:
            state = {k: v.to(torch.bfloat16) for k, v in state.items()}
            if self.adapter_dir is not None:
                from streamrl.export import save_adapter_and_merged

                save_adapter_and_merged(state, self.model_dir, self.adapter_dir, Path(out_dir))
            else:
                self.model.config.use_cache = True
                self.model.config.dtype = torch.bfloat16
                self.model.save_pretrained(out_dir, state_dict=state, safe_serialization=True)
                load_tokenizer(self.model_dir).save_pretrained(out_dir)
        dist.barrier()

    def close(self) -> None:
        self.record.close()
        self.publisher.close()
        self.buffer.close()
        self.ctx.destroy(linger=0)
        if dist.is_initialized():
            dist.destroy_process_group()
