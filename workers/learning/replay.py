"""``streamrl replay RUN_DIR``: the learner alone, retrained over a run's training record.

The record (``training_record``) holds every step's groups in trained order, the RNG state the
step started from and a digest of the weights it made. A replay builds the learner exactly as the
run did (``learner.build_train_step``: same model files, compute dtype, threads, seed, rank count,
FSDP2 over gloo on loopback) and feeds it the recorded steps:

- **The original arm** (always): nothing changed. After each step its weights' digest must equal
  the recorded one; the first step that differs ends the replay, and the command exits 1 naming
  it. On CPU with the run's rank and thread counts the replay is bitwise.
- **A counterfactual arm** (``--set KEY=VALUE``, any loss, correction, clip, KL, lr or entropy
  key): trains the same batches under the changed config, in lockstep with the original. Before
  each step both score the step's tokens, which gives the arm's divergence from the original
  policy on exactly the tokens the run trained on (mean |delta logprob|, k3) and both entropies;
  the step's own figures (importance-weight mean, ESS, k3, clip fractions, loss) come from the
  train step as in a run.

Each arm's figures go to ``RUN_DIR/replays/<arm>.jsonl``, one line per step; ``--compare``
(``replay_compare``) prints the arms side by side.

Example: a 5-step run -> ``replay(ReplayRequest(run_dir))`` trains steps 1..5 and returns
``first_mismatch=None``; with ``arm_overrides=[("algorithm.correction", "none")]`` it also
writes ``replays/algorithm.correction=none.jsonl``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import msgspec
import torch
import torch.distributed as dist

from streamrl.algorithms import kl as kl_lib
from streamrl.config import Config, Override, load_config, parse_overrides
from streamrl.transport import LOOPBACK
from streamrl.workers.learning import checkpoint
from streamrl.workers.learning.learner import build_train_step, group_listener, rendezvous
from streamrl.workers.learning.train_step import TrainStep
from streamrl.workers.learning.training_record import (
    RecordedRun,
    RecordedStep,
    read_record,
    weights_digest,
)

log = logging.getLogger(__name__)

REPLAYS_DIR = "replays"
ORIGINAL = "original"


@dataclass
class ReplayRequest:
    run_dir: Path
    # The counterfactual arm's changes (empty: the original arm alone, a bitwise check).
    arm_overrides: list[Override] = field(default_factory=list)
    # Stop after this step (None: every recorded step).
    until_step: int | None = None
    # Start from the run's checkpoint of this version instead of the base model.
    from_checkpoint: int | None = None
    # Greedy held-out accuracy of every arm after these steps (0: before the first).
    eval_at: list[int] = field(default_factory=list)


@dataclass
class ReplayResult:
    replayed: list[int]  # the steps trained, in order
    first_mismatch: int | None  # the first step whose weights differ from the run's
    problems: list[str]  # what the record lacks (one line each)
    outputs: list[Path]  # each arm's figures

    @property
    def bitwise(self) -> bool:
        return self.first_mismatch is None


class ReplayError(ValueError):
    """A replay that cannot start; the message is one line."""


def arm_name(overrides: list[Override]) -> str:
    """The arm's name, from its changes: ``algorithm.correction=none,learner.lr=0.0001``."""
    return ",".join(f"{k}={v}" for k, v in parse_overrides(overrides)) or ORIGINAL


def replay(request: ReplayRequest) -> ReplayResult:
    """Replay ``request.run_dir`` (every rank of the run, each its own process when there are
    several) and return what happened; ``ReplayError`` when it cannot start."""
    record = read_record(request.run_dir)
    config = _config(request.run_dir, [])
    if request.arm_overrides:
        _config(request.run_dir, request.arm_overrides)  # refused here, before any model loads
    world = int(record.header.get("world_size", 1))
    if world != len(record.ranks):
        raise ReplayError(
            f"{request.run_dir}: the record has {len(record.ranks)} of the run's {world} ranks"
        )
    if record.header.get("device", "cpu") != "cpu" and not torch.cuda.is_available():
        raise ReplayError(f"the run trained on {record.header['device']}, which is not here")
    if request.eval_at and record.header.get("adapter_dir"):
        raise ReplayError("--eval-at evaluates full-weight runs only (this one trained LoRA)")
    for rank in range(world):
        _steps_to_replay(record, rank, request)  # refused here, not in a rank's process
    start, checkpoints = request.from_checkpoint, request.run_dir / "checkpoints"
    if start is not None and not checkpoint.path_for(checkpoints, start).is_dir():
        raise ReplayError(f"{request.run_dir}: no checkpoint of version {start}")
    out_dir = request.run_dir / REPLAYS_DIR
    out_dir.mkdir(exist_ok=True)
    # Bound here, handed to rank 0: no other process can take the port before the ranks meet.
    listener = group_listener(LOOPBACK, world)
    master = f"{LOOPBACK}:{listener.getsockname()[1]}"
    if world == 1:
        _replay_rank(0, world, master, request, record, config.learner.backend, listener)
    else:
        import torch.multiprocessing as mp

        backend = config.learner.backend
        args = (world, master, request, record, backend, listener)
        try:
            mp.spawn(_replay_rank, args=args, nprocs=world)
        finally:
            listener.close()  # the spawned rank 0 took a duplicate of it
    summary = json.loads((out_dir / f"{arm_name(request.arm_overrides)}.summary.json").read_text())
    outputs = [out_dir / f"{ORIGINAL}.jsonl"]
    if request.arm_overrides:
        outputs.append(out_dir / f"{arm_name(request.arm_overrides)}.jsonl")
    return ReplayResult(summary["replayed"], summary["first_mismatch"], record.problems, outputs)


def _config(run_dir: Path, overrides: list[Override]) -> Config:
    from streamrl.config import ConfigError

    try:
        return load_config(run_dir / "config.yaml", overrides)
    except (ConfigError, FileNotFoundError) as exc:
        raise ReplayError(f"{run_dir}: {exc}") from None


def _replay_rank(
    rank: int,
    world: int,
    master: str,
    request: ReplayRequest,
    record: RecordedRun,
    backend: str,
    listener: socket.socket,
) -> None:
    """One rank of the replay (the whole of it with one rank); ``record``: as ``replay`` read
    it, so that no rank reads and decodes the record again; ``listener``: the store's socket,
    bound at ``master`` (rank 0 serves on it)."""
    header = record.header
    torch.set_num_threads(int(header.get("threads", 1)))
    store = rendezvous(master, rank, world, listener)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world)
    try:
        arms = _build_arms(request, header, world)
        if request.from_checkpoint is not None:
            for step in arms.values():
                _load_checkpoint(step, request.run_dir, request.from_checkpoint)
        held_out = HeldOut(request, header) if request.eval_at else None
        _run_steps(rank, arms, _steps_to_replay(record, rank, request), request, held_out)
    finally:
        dist.destroy_process_group()


def _build_arms(request: ReplayRequest, header: dict[str, Any], world: int) -> dict[str, TrainStep]:
    """The original arm and, with overrides, the counterfactual one: each built as the learner
    built its model (the seed set first: a critic's new head draws from it)."""
    device = torch.device(header.get("device", "cpu"))
    adapter = Path(header["adapter_dir"]) if header.get("adapter_dir") else None
    arms: dict[str, TrainStep] = {}
    for overrides in ([], request.arm_overrides) if request.arm_overrides else ([],):
        config = _config(request.run_dir, overrides)
        torch.manual_seed(config.run.seed)
        arms[arm_name(overrides)] = build_train_step(
            config, Path(header["model_dir"]), device, world, header["compute_dtype"], adapter
        )
    return arms


def _load_checkpoint(step: TrainStep, run_dir: Path, version: int) -> None:
    modules: checkpoint.Modules = {"policy": (step.policy, step.optimizer)}
    if step.critic is not None:
        modules["critic"] = (step.critic.model, step.critic.optimizer)
    _, extra = checkpoint.load(modules, checkpoint.path_for(run_dir / "checkpoints", version))
    step.restore_coefficients(extra)


def _steps_to_replay(record: RecordedRun, rank: int, request: ReplayRequest) -> list[RecordedStep]:
    start = request.from_checkpoint or 0
    wanted = set(record.steps)
    steps = [s for s in record.ranks[rank] if s.step > start and s.step in wanted]
    if request.until_step is not None:
        steps = [s for s in steps if s.step <= request.until_step]
    if not steps or steps[0].step != start + 1:
        first = steps[0].step if steps else None
        raise ReplayError(
            f"{request.run_dir}: the record does not hold step {start + 1} (its first is "
            f"{first}); replay from a checkpoint before it with --from-checkpoint"
        )
    return steps


def _run_steps(
    rank: int,
    arms: dict[str, TrainStep],
    steps: list[RecordedStep],
    request: ReplayRequest,
    held_out: HeldOut | None,
) -> None:
    out_dir = request.run_dir / REPLAYS_DIR
    name = arm_name(request.arm_overrides)
    files = {arm: (out_dir / f"{arm}.jsonl").open("w") if rank == 0 else None for arm in arms}
    original = arms[ORIGINAL]
    replayed: list[int] = []
    first_mismatch = None
    if held_out is not None and 0 in request.eval_at and steps[0].step == 1:
        for arm, step in arms.items():  # before the first step: its own row, step 0
            _write_row(files[arm], {"step": 0, **held_out(step, 0)})
    try:
        for recorded in steps:
            figures: dict[str, dict[str, float]] = {arm: {} for arm in arms}
            if name != ORIGINAL:
                figures[name].update(_divergence(original, arms[name], recorded))
            for arm, step in arms.items():
                torch.set_rng_state(recorded.rng_state)
                figures[arm].update(step(recorded.groups, recorded.step - 1))
            same = weights_digest(original.trained_modules) == recorded.digest
            same = _everywhere(same, original.device)
            figures[ORIGINAL]["replay/bitwise"] = float(same)
            if held_out is not None and recorded.step in request.eval_at:
                for arm, step in arms.items():
                    figures[arm].update(held_out(step, recorded.step))
            replayed.append(recorded.step)
            for arm, handle in files.items():
                _write_row(handle, {"step": recorded.step, **_without_timings(figures[arm])})
            if not same:
                first_mismatch = recorded.step
                break
    finally:
        for handle in files.values():
            if handle is not None:
                handle.close()
    if rank == 0:
        summary = {"replayed": replayed, "first_mismatch": first_mismatch, "pid": os.getpid()}
        (out_dir / f"{name}.summary.json").write_text(json.dumps(summary))


class HeldOut:
    """Greedy held-out evaluation of an arm's weights, as the run evaluated (its eval section,
    prompts and checks), on an HF engine that rank 0 holds. Collective: every rank gathers."""

    def __init__(self, request: ReplayRequest, header: dict[str, Any]) -> None:
        from streamrl.evaluation import eval_prompts
        from streamrl.models import load_tokenizer
        from streamrl.workers.engines.base import EngineArgs
        from streamrl.workers.engines.hf import HFEngine

        self.config = _config(request.run_dir, [])
        model_dir = Path(header["model_dir"])
        self.prompts = eval_prompts(self.config)
        self.tokenizer = load_tokenizer(model_dir)
        args = EngineArgs(model_dir, dtype=header["compute_dtype"], seed=self.config.run.seed)
        self.engine = HFEngine(args) if dist.get_rank() == 0 else None

    def __call__(self, step: TrainStep, version: int) -> dict[str, float]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        from streamrl.workers.generation.evaluator import evaluate

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(step.policy, options=options)
        if self.engine is None:
            return {}
        names = self.engine.params.keys()
        image = [(k, v.to(torch.bfloat16)) for k, v in state.items() if k in names]
        self.engine.update_weights(image, version)  # the bf16 image the generators would run
        result = evaluate(self.engine, self.tokenizer, self.config, self.prompts)
        return {k: v for k, v in result.metrics.items() if k.startswith("eval/")}


def _write_row(handle: TextIO | None, row: dict[str, float]) -> None:
    if handle is not None:  # rank 0's
        handle.write(json.dumps(row) + "\n")
        handle.flush()


def _divergence(original: TrainStep, arm: TrainStep, recorded: RecordedStep) -> dict[str, float]:
    """The arm's distance from the original policy on the step's trained tokens, before the
    step: both score exactly the recorded tokens (collective)."""
    base_lp, base_entropy = original.response_tokens(recorded.groups)
    arm_lp, arm_entropy = arm.response_tokens(recorded.groups)
    sums = (
        torch.stack(
            [
                (arm_lp - base_lp).abs().sum(),
                kl_lib.estimate(base_lp, arm_lp, "k3").sum(),
                arm_entropy.sum(),
                base_entropy.sum(),
                torch.tensor(float(arm_lp.numel())),
            ]
        )
        .double()
        .to(original.device)
    )
    dist.all_reduce(sums)
    tokens = max(float(sums[4]), 1.0)
    return {
        "replay/logprob_abs_from_original": float(sums[0]) / tokens,
        "replay/k3_from_original": float(sums[1]) / tokens,
        "replay/entropy": float(sums[2]) / tokens,
        "replay/entropy_original": float(sums[3]) / tokens,
    }


def _everywhere(flag: bool, device: torch.device) -> bool:
    """Whether ``flag`` holds on every rank (one scalar all-reduce)."""
    value = torch.tensor([float(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value.item())


def _without_timings(figures: dict[str, float]) -> dict[str, float]:
    # Seconds differ between a run and its replay; the figures a replay compares do not.
    return {k: v for k, v in figures.items() if not k.startswith("time/")}


def as_builtins(result: ReplayResult) -> dict[str, Any]:
    return msgspec.to_builtins(
        {
            "replayed": result.replayed,
            "first_mismatch": result.first_mismatch,
            "problems": result.problems,
            "outputs": [str(p) for p in result.outputs],
        }
    )
