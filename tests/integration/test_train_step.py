"""The training step trains exactly what was sampled (docs/design.md §5b), on real FSDP2 ranks.

- gradients do not depend on how the batch is split: micro-batch sizes 1, 2 and 8 and one vs
  two gloo ranks, for every ``loss_agg``, with the entropy bonus, the in-loss KL and the value
  loss on (fp32, relative error <= 1e-5);
- the learner's logprobs equal the HF engine's behaviour logprobs on samples it generated,
  with pad-id tokens inside the prompts and two temperatures in one micro-batch, on every
  architecture of ``streamrl.models.tiny`` too (Qwen2, Qwen3, Gemma3 with sliding-window
  layers, Mistral, Phi-3, Qwen3-MoE), and on every policy token of multi-turn episodes (the
  environment's tokens in no figure);
- the fp32 forward runs on the bf16 image while the masters stay fp32;
- with several PPO updates per batch the clip acts; a non-finite gradient skips the update.

Gradients are read with a recording optimizer (a test double for AdamW: it stores the full
gradient instead of stepping).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import random
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from support import random_groups, whole
from torch.distributed.tensor import distribute_tensor

from streamrl.config import Config, load_config
from streamrl.envs import Environment, StepResult
from streamrl.models import TINY, load_causal_lm, load_tokenizer, resolve_model, stop_token_ids
from streamrl.models.tiny import ARCHITECTURES
from streamrl.protocol import Trajectory, TrajectoryGroup
from streamrl.tasks.base import Prompt
from streamrl.transport import free_port
from streamrl.workers.engines.base import EngineArgs, SamplingParams
from streamrl.workers.engines.hf import HFEngine
from streamrl.workers.generation.episodes import EpisodeRunner
from streamrl.workers.learning.batching import build_micro_batches, micro_batch_rows
from streamrl.workers.learning.learner import build_train_step, rendezvous
from streamrl.workers.learning.train_step import TrainStep

AGGREGATIONS = [
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
]
CPU = torch.device("cpu")
TWO_RANK_BUDGET = 36  # tokens: 4 micro-batches planned on rank 0, 3 on rank 1


class GradRecorder(torch.optim.Optimizer):
    """Stores every parameter's full gradient at ``step`` (collective under FSDP2)."""

    def __init__(self, params) -> None:
        super().__init__(list(params), {"lr": 0.0})
        self.grads: list[torch.Tensor] = []

    @torch.no_grad()
    def step(self, closure=None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                grad = whole(p.grad)
                self.grads.append(grad.detach().clone().flatten())


def _config(*overrides: str) -> Config:
    return load_config(
        None,
        ["model.name=tiny-random-llama", "model.compute_dtype=float32", *overrides],
    )


def _split_config(agg: str, micro_batch_size: int, ranks: int, tokens: int = 0) -> Config:
    return _config(
        f"learner.micro_batch_tokens={tokens}",
        f"algorithm.loss_agg={agg}",
        "algorithm.advantage=gae",
        "algorithm.entropy_coef=0.01",
        "algorithm.kl.coef=0.1",
        "learner.grad_clip=1.0e9",
        "learner.groups_per_step=4",
        f"learner.count={ranks}",
        f"learner.micro_batch_size={micro_batch_size}",
    )


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return resolve_model(TINY)


def _process_group(world_size: int = 1, rank: int = 0, master: str | None = None) -> None:
    master = master or "127.0.0.1:0"  # a group of one binds any free port
    store = rendezvous(master, rank, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)


def _perturb(module: torch.nn.Module, scale: float, seed: int) -> None:
    """Add the same full-shape noise on any number of ranks (each keeps its shard of it)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            noise = torch.randn(p.shape, generator=gen) * scale
            if hasattr(p, "device_mesh"):
                noise = distribute_tensor(noise, p.device_mesh, p.placements)
            p.add_(noise)


def _recorded_grads(config: Config, model_dir: Path, world_size: int, rank: int) -> dict:
    """One step on this rank's share of the same 4 groups; the full gradients it produced."""
    step = build_train_step(config, model_dir, CPU, world_size)
    _perturb(step.ref_model, 0.05, seed=1)  # a reference apart from the policy: KL != 0
    _perturb(step.critic.model.head, 0.05, seed=2)  # a head that passes gradient back
    step.optimizer = GradRecorder(step.policy.parameters())
    step.critic.optimizer = GradRecorder(step.critic.model.parameters())
    groups = random_groups(4, 4, seed=3, shared_prompt=True)
    share = len(groups) // world_size
    metrics = step(groups[rank * share : (rank + 1) * share], version=0)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    return {
        "policy": torch.cat(step.optimizer.grads),
        "critic": torch.cat(step.critic.optimizer.grads),
    }


def _two_rank_main(rank: int, master: str, model_dir: str, out: str, log: str) -> None:
    # Both streams, C++ included (an abort's message), into this rank's file.
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    torch.set_num_threads(1)
    _process_group(2, rank, master)
    results = {
        agg: _recorded_grads(_split_config(agg, 3, 2), Path(model_dir), 2, rank)
        for agg in AGGREGATIONS
    }
    # A token budget plans a different number of micro-batches on each rank (the counts
    # are then made equal); token-mean only, the split rule is the same for every agg.
    results["tokens"] = _recorded_grads(
        _split_config("token-mean", 3, 2, tokens=TWO_RANK_BUDGET), Path(model_dir), 2, rank
    )
    if rank == 0:
        torch.save(results, out)
    # Neither rank tears down its gloo pairs while the other may still be using them.
    dist.barrier()
    dist.destroy_process_group()


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def two_rank_grads(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("grads") / "two_ranks.pt"
    logs = [out.with_name(f"rank{r}.log") for r in range(2)]
    ctx = mp.get_context("spawn")
    master = f"127.0.0.1:{free_port()}"
    procs = [
        ctx.Process(target=_two_rank_main, args=(r, master, str(model_dir), str(out), str(logs[r])))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    codes = [p.exitcode for p in procs]
    for p in procs:  # only ours, by handle
        if p.is_alive():
            p.kill()
    tails = [log.read_text()[-2000:] if log.is_file() else "(no log)" for log in logs]
    assert codes == [0, 0], (codes, tails)
    return torch.load(out)


@pytest.mark.slow
@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_gradients_do_not_depend_on_the_split(agg: str, model_dir: Path, two_rank_grads) -> None:
    _process_group()
    try:
        by_size = {
            size: _recorded_grads(_split_config(agg, size, 1), model_dir, 1, 0)
            for size in (1, 2, 8)
        }
        # Token budgets: sorted by length, 2-4 rows per micro-batch, or each row alone.
        by_budget = {
            tokens: _recorded_grads(_split_config(agg, 8, 1, tokens), model_dir, 1, 0)
            for tokens in (1, 40)
        }
    finally:
        dist.destroy_process_group()
    reference = by_size[8]  # shared-prompt layout; micro-batches of 1 are plain
    layouts = build_micro_batches(
        random_groups(4, 4, seed=3, shared_prompt=True), 8, 0, share_prompts_hidden=64
    )
    assert all(b.shares_prompts for b in layouts)
    assert reference["policy"].norm() > 0 and reference["critic"].norm() > 0
    for name in ("policy", "critic"):
        for size in (1, 2):
            err = _relative_error(by_size[size][name], reference[name])
            assert err <= 1e-5, f"{name} grads, micro-batch {size} vs 8: relative error {err:.2e}"
        err = _relative_error(two_rank_grads[agg][name], reference[name])
        assert err <= 1e-5, f"{name} grads, 2 ranks vs 1: relative error {err:.2e}"
        for tokens, grads in by_budget.items():
            err = _relative_error(grads[name], reference[name])
            assert err <= 1e-5, f"{name} grads, {tokens}-token micro-batches: error {err:.2e}"
    if agg == "token-mean":
        groups = random_groups(4, 4, seed=3, shared_prompt=True)
        planned = [
            len(
                micro_batch_rows(
                    [
                        t.num_prompt_tokens + t.num_response_tokens
                        for g in part
                        for t in g.trajectories
                    ],
                    3,
                    TWO_RANK_BUDGET,
                )
            )
            for part in (groups[:2], groups[2:])
        ]
        assert planned[0] != planned[1], planned  # so that the counts had to be made equal
        for name in ("policy", "critic"):
            err = _relative_error(two_rank_grads["tokens"][name], reference[name])
            assert err <= 1e-5, f"{name} grads, 2 ranks with a token budget: error {err:.2e}"


def _engine_groups(model_dir: Path, shared: bool = False) -> tuple[list[TrajectoryGroup], int]:
    """Two groups sampled by the fp32 HF engine at temperatures 0.7 and 1.3, from prompts
    that hold the pad id in the middle (a mask built from ids would hide those tokens); with
    ``shared`` a group's four samples share one prompt, as GRPO's do."""
    tokenizer = load_tokenizer(model_dir)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    engine = HFEngine(EngineArgs(model_dir, dtype="float32", seed=0))
    rng = random.Random(0)
    groups, tokens = [], 0
    for g, temperature in enumerate((0.7, 1.3)):
        prompts = [
            [1, *(rng.choice([pad, rng.randrange(4, 100)]) for _ in range(rng.randrange(3, 9)))]
            for _ in range(4)
        ]
        if shared:
            prompts = [max(prompts, key=lambda p: p.count(pad))] * 4
        assert any(pad in p[1:] for p in prompts)
        params = SamplingParams(temperature=temperature, max_new_tokens=12, stop_token_ids=(eos,))
        trajectories = []
        for prompt, out in zip(prompts, engine.generate(prompts, params), strict=True):
            tokens += len(out.response_ids)
            trajectories.append(
                Trajectory.from_lists(
                    prompt,
                    out.response_ids,
                    out.logprobs,  # float32 values: packed back to float32 exactly
                    out.token_versions,
                    reward=rng.random(),
                    finish_reason=out.finish_reason,
                    generator_id=0,
                    temperature=temperature,
                )
            )
        groups.append(TrajectoryGroup(f"e{g}", f"p{g}", trajectories, 0.0, 0.0))
    return groups, tokens


# With sliding-window layers (Gemma3) the learner does not share prompts: its one 4-D mask
# would let windowed layers see the whole prompt (max |delta| 0.11 when it did).
SLIDING = {"tiny-random-gemma3"}


@pytest.mark.parametrize("arch", [TINY, *ARCHITECTURES])
@pytest.mark.parametrize("shared", [False, True])
def test_learner_logprobs_equal_the_engines_behaviour_logprobs(arch: str, shared: bool) -> None:
    """Also in the shared-prompt layout: one sequence per group, each response seeing only
    the prompt and itself, at the positions it was sampled at. On every architecture: the
    learner's forward (FSDP2 blocks, packed micro-batches, the shared-prompt mask) is the
    engine's (Gemma3: its sliding-window layers see the same window; prompts and responses
    run past its 16 columns; it trains without sharing prompts)."""
    model_dir = resolve_model(arch)
    groups, tokens = _engine_groups(model_dir, shared)
    _process_group()
    try:
        step = build_train_step(
            _config(
                f"model.name={arch}", "learner.groups_per_step=2", "learner.micro_batch_size=8"
            ),
            model_dir,
            CPU,
            1,
        )
        (batch,) = step._micro_batches([groups])[0]
        shares = shared and arch not in SLIDING
        assert batch.shares_prompts == shares and len(batch.input_ids) == (2 if shares else 8)
        metrics = step(groups, version=0)
    finally:
        dist.destroy_process_group()
    assert metrics["mismatch/tokens"] == tokens > 0
    assert metrics["mismatch/logprob_abs_max"] <= 1e-4, metrics
    assert metrics["policy/is_weight_max"] <= 1 + 1e-4, metrics
    # Entropy is tracked every step, with no entropy term in the loss (entropy_coef 0): a
    # random tiny model's is near log(vocab).
    assert 0 < metrics["policy/entropy"] < 1.01 * math.log(step.policy.config.vocab_size)


class _Feedback(Environment):
    """Says "no" to every turn: episodes run to ``env.max_turns``."""

    def reset(self, prompt: Prompt) -> None:
        pass

    def step(self, text: str) -> StepResult:
        return StepResult(observation="no", reward=0.1 * len(text))


def _episode_groups(model_dir: Path) -> tuple[list[TrajectoryGroup], int]:
    """Two groups of four 3-turn episodes sampled by the fp32 HF engine (multi-turn: each
    turn's context is the prompt and every token before it, the environment's included)."""
    config = _config("env.name=guess", "rewards=[]", "env.max_turns=3", "env.max_tokens=200")
    tokenizer = load_tokenizer(model_dir)
    engine = HFEngine(EngineArgs(model_dir, dtype="float32", seed=0))
    runner = EpisodeRunner(config, tokenizer)
    runner.make_env = _Feedback
    prompts = [Prompt(f"p{i}", [{"role": "user", "content": f"q{i}"}], "", "t") for i in range(2)]
    params = SamplingParams(max_new_tokens=6, stop_token_ids=stop_token_ids(tokenizer))
    episodes = runner.play(engine, prompts, 4, params)
    runner.close()
    assert {e.turns for e in episodes} == {3} and all(0 in e.action_mask for e in episodes)
    groups = [
        TrajectoryGroup(
            f"e{g}",
            f"p{g}",
            [runner.trajectory(e, 0, 1.0) for e in episodes[4 * g : 4 * g + 4]],
            0.0,
            0.0,
        )
        for g in range(2)
    ]
    return groups, sum(sum(e.action_mask) for e in episodes)


@pytest.mark.parametrize("shared", [False, True])
def test_learner_logprobs_equal_the_engines_across_an_episodes_turns(
    model_dir: Path, shared: bool
) -> None:
    """Multi-turn episodes: on every policy token of every turn the learner's logprob is the
    engine's, and the environment's tokens count in no figure (``mismatch/tokens`` is the
    policy's tokens alone)."""
    groups, policy_tokens = _episode_groups(model_dir)
    _process_group()
    try:
        step = build_train_step(
            _config(
                "learner.groups_per_step=2",
                "learner.micro_batch_size=8",
                f"learner.share_prompts={str(shared).lower()}",
            ),
            model_dir,
            CPU,
            1,
        )
        metrics = step(groups, version=0)
    finally:
        dist.destroy_process_group()
    assert metrics["mismatch/tokens"] == policy_tokens > 0
    assert metrics["mismatch/logprob_abs_max"] <= 1e-4, metrics
    assert metrics["policy/is_weight_max"] <= 1 + 1e-4, metrics


def test_fp32_forward_runs_on_the_bf16_image(model_dir: Path) -> None:
    _process_group()
    try:
        step = build_train_step(_config(), model_dir, CPU, 1)
        _perturb(step.policy, 1e-3, seed=4)  # masters off the bf16 grid
        masters = {n: whole(p).clone() for n, p in step.policy.named_parameters()}
        plain = load_causal_lm(model_dir, "float32")
        plain.load_state_dict({n: m.to(torch.bfloat16).float() for n, m in masters.items()})
        ids = torch.randint(4, 100, (3, 10))
        torch.testing.assert_close(step.policy(input_ids=ids).logits, plain(input_ids=ids).logits)
        step.policy(input_ids=ids).logits.sum().backward()  # backward frees the gathered params
        after = {n: whole(p) for n, p in step.policy.named_parameters()}
    finally:
        dist.destroy_process_group()
    off_grid = [n for n, m in after.items() if not torch.equal(m, m.to(torch.bfloat16).float())]
    assert off_grid and all(torch.equal(after[n], masters[n]) for n in masters)


def test_several_updates_per_batch_make_the_clip_act(model_dir: Path) -> None:
    _process_group()
    try:
        config = _config(
            "learner.mini_batches=4",
            "learner.ppo_epochs=2",
            "learner.lr=1e-2",
            "learner.micro_batch_size=2",
        )
        step = build_train_step(config, model_dir, CPU, 1)
        metrics = step(random_groups(4, 4, seed=5), version=0)
    finally:
        dist.destroy_process_group()
    assert metrics["train/updates"] == 8
    assert metrics["policy/clipfrac_upper"] + metrics["policy/clipfrac_lower"] > 0, metrics
    assert metrics["policy/approx_kl"] > 0


def _entropy_run(model_dir: Path, *overrides: str) -> tuple[torch.Tensor, list[float]]:
    """One step's gradient on fixed groups, and the coefficient each of 3 steps reported."""
    step = build_train_step(_config("learner.grad_clip=1.0e9", *overrides), model_dir, CPU, 1)
    recorder = step.optimizer = GradRecorder(step.policy.parameters())
    coefs = [step(random_groups(4, 4, seed=9), version=v)["policy/entropy_coef"] for v in range(3)]
    return recorder.grads[0], coefs  # the first step's: its coefficient is the config's


def test_the_entropy_bonus_acts_only_below_its_target(model_dir: Path) -> None:
    """A random tiny model's entropy is near log(vocab). A target above it opens the gate: the
    gradient is a fixed bonus's, and the coefficient climbs. A target below it shuts the gate:
    the gradient is the no-bonus one, and the coefficient decays to 0."""
    _process_group()
    try:
        plain, _ = _entropy_run(model_dir)
        fixed, fixed_coefs = _entropy_run(model_dir, "algorithm.entropy_coef=0.5")
        steer = (
            "algorithm.entropy_coef=0.5",
            "algorithm.entropy_coef_step=0.25",
            "algorithm.entropy_coef_max=2",
        )
        high, high_coefs = _entropy_run(model_dir, *steer, "algorithm.entropy_target=100")
        low, low_coefs = _entropy_run(model_dir, *steer, "algorithm.entropy_target=0.01")
    finally:
        dist.destroy_process_group()
    assert not torch.allclose(plain, fixed)
    torch.testing.assert_close(high, fixed, rtol=0, atol=0)
    torch.testing.assert_close(low, plain, rtol=0, atol=0)
    assert fixed_coefs == [0.5, 0.5, 0.5]
    assert high_coefs == [0.5, 0.75, 1.0] and low_coefs == [0.5, 0.25, 0.0]


def _taught(seed: int, teacher_shift: float | None, top_k: int = 0) -> list[TrajectoryGroup]:
    """``random_groups`` with flat rewards, a teacher's logprobs (behaviour + shift; None:
    no teacher) and with ``top_k`` its top-k (random ids at random logprobs)."""
    from streamrl.protocol import pack_float32, pack_int32

    rng = random.Random(seed)
    groups = random_groups(4, 4, seed=seed)
    for t in (t for g in groups for t in g.trajectories):
        t.reward = 0.0
        if teacher_shift is not None:
            t.teacher_logprobs = pack_float32([v + teacher_shift for v in t.logprob_list()])
            t.teacher_coef = 0.5
        if top_k:
            n = t.num_response_tokens * top_k
            t.teacher_top_ids = pack_int32([rng.randrange(4, 100) for _ in range(n)])
            t.teacher_top_logprobs = pack_float32([-rng.uniform(0.5, 4) for _ in range(n)])
            t.teacher_top_coef = 0.5
    return groups


def _teacher_run(model_dir: Path, groups: list[TrajectoryGroup]) -> tuple[torch.Tensor, dict]:
    overrides = ["learner.grad_clip=1.0e9", "rewards=[{teacher: {model: x, top_k: 4}}]"]
    step = build_train_step(_config(*overrides), model_dir, CPU, 1)
    recorder = step.optimizer = GradRecorder(step.policy.parameters())
    metrics = step(groups, version=0)
    return recorder.grads[0], metrics


def test_a_teacher_teaches_where_rewards_are_flat(model_dir: Path) -> None:
    """On a real FSDP2 step with flat rewards (no GRPO signal): no teacher, or a teacher that
    agrees with the sampler token for token, gives a zero gradient; a teacher that disagrees,
    or a top-k teacher, gives one, and the step logs both terms."""
    _process_group()
    try:
        silent, _ = _teacher_run(model_dir, _taught(3, None))
        agrees, agreeing = _teacher_run(model_dir, _taught(3, 0.0))
        differs, differing = _teacher_run(model_dir, _taught(3, 1.0))
        top, topped = _teacher_run(model_dir, _taught(3, None, top_k=4))
    finally:
        dist.destroy_process_group()
    assert silent.abs().max() == 0 and agrees.abs().max() == 0
    assert differs.abs().max() > 0 and top.abs().max() > 0
    assert agreeing["distill/reverse_kl"] == pytest.approx(0.0, abs=1e-6)
    assert differing["distill/reverse_kl"] == pytest.approx(-1.0, abs=1e-5)
    assert topped["distill/forward_kl_top_k"] != 0 and "distill/reverse_kl" not in topped


def _full(step: TrainStep) -> dict[str, torch.Tensor]:
    return {n: whole(p).clone() for n, p in step.policy.named_parameters()}


def test_a_non_finite_gradient_skips_the_update(model_dir: Path) -> None:
    _process_group()
    try:
        step = build_train_step(_config("learner.lr=1e-3"), model_dir, CPU, 1)
        poisoned = random_groups(4, 4, seed=6)
        poisoned[1].trajectories[0].reward = float("nan")
        before = _full(step)
        metrics = step(poisoned, version=0)
        assert metrics["train/skipped_updates"] == 1
        assert all(torch.equal(before[n], p) for n, p in _full(step).items())
        metrics = step(random_groups(4, 4, seed=7), version=1)
        assert metrics["train/skipped_updates"] == 1 and math.isfinite(metrics["loss/total"])
        assert any(not torch.equal(before[n], p) for n, p in _full(step).items())
    finally:
        dist.destroy_process_group()


def test_fused_adamw_updates_as_the_multi_tensor_one(model_dir: Path) -> None:
    """The learner's AdamW is the fused kernel on CPU too; on FSDP2's sharded parameters its
    update is the multi-tensor implementation's, to a rounding of the parameters."""
    _process_group()
    try:
        updated = []
        for fused in (True, False):
            config = _config("learner.lr=1e-3", "learner.weight_decay=0.1")
            step = build_train_step(config, model_dir, CPU, 1)
            settings = step.optimizer.defaults
            assert settings["fused"] is True
            if not fused:
                step.optimizer = torch.optim.AdamW(
                    step.policy.parameters(),
                    lr=settings["lr"],
                    betas=settings["betas"],
                    weight_decay=settings["weight_decay"],
                    foreach=True,
                )
            before = _full(step)
            step(random_groups(4, 4, seed=8), version=0)
            updated.append({n: (p - before[n]).detach() for n, p in _full(step).items()})
    finally:
        dist.destroy_process_group()
    fused_update, reference = updated
    assert max(float(u.abs().max()) for u in reference.values()) > 1e-4  # lr 1e-3 moved them
    for name, update in reference.items():
        torch.testing.assert_close(fused_update[name], update, rtol=1e-4, atol=2e-7)


def test_drift_is_measured_by_the_versions_of_lag() -> None:
    """``drift/k3_lag*`` (the staleness tuner's guard): KL(behaviour || learner) on the
    tokens sampled one, two, three or more versions behind the learner's weights; none on
    tokens of its own version, which are the numerics' (``mismatch/*``)."""
    model_dir = resolve_model(TINY)
    groups, _ = _engine_groups(model_dir, False)
    _process_group()
    try:
        config = _config(
            "learner.groups_per_step=2", "learner.micro_batch_size=8", "learner.lr=1e-2"
        )
        step = build_train_step(config, model_dir, CPU, 1)
        fresh = step(groups, version=0)  # sampled with these weights; the step moves them
        one_behind = step(groups, version=1)
        two_behind = step(groups, version=2)
    finally:
        dist.destroy_process_group()
    assert not [k for k in fresh if k.startswith("drift/")], fresh
    assert one_behind["mismatch/tokens"] == 0 and "drift/k3_lag2" not in one_behind
    assert one_behind["drift/k3_lag1"] > max(100 * fresh["mismatch/k3"], 1e-6), one_behind
    assert "drift/k3_lag1" not in two_behind
    assert two_behind["drift/k3_lag2"] > max(100 * fresh["mismatch/k3"], 1e-6), two_behind


def _guided_grads(model_dir: Path, guided: bool, *overrides: str) -> tuple[torch.Tensor, dict]:
    """One step's gradient on fixed groups whose responses carry zeros as behaviour logprobs,
    marked as guided reference responses or not."""
    step = build_train_step(_config("learner.grad_clip=1.0e9", *overrides), model_dir, CPU, 1)
    recorder = step.optimizer = GradRecorder(step.policy.parameters())
    groups = random_groups(4, 4, seed=11)
    for t in (t for g in groups for t in g.trajectories):
        t.behavior_logprobs, t.guided = bytes(len(t.behavior_logprobs)), guided
    metrics = step(groups, version=0)
    return recorder.grads[0], metrics


def test_a_guided_reference_trains_with_correction_weight_one(model_dir: Path) -> None:
    """A reference response (``algorithm.guidance``) has no behaviour logprobs: the learner
    takes its proximal policy as its behaviour, so it trains as an uncorrected sample would,
    whatever zeros it carries, and no mismatch figure counts it."""
    _process_group()
    try:
        guided, metrics = _guided_grads(model_dir, True)
        uncorrected, _ = _guided_grads(
            model_dir, False, "algorithm.correction=none", "algorithm.allow_uncorrected=true"
        )
        zeros_as_behaviour, _ = _guided_grads(model_dir, False)
    finally:
        dist.destroy_process_group()
    torch.testing.assert_close(guided, uncorrected, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(guided, zeros_as_behaviour)
    assert metrics["mismatch/tokens"] == 0
