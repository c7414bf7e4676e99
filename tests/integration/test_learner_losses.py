"""The learner trains the tiny model with every loss option, through the config, without NaN.

One real FSDP2 rank (gloo, world size 1) in this process; the batches are synthetic groups
with behaviour logprobs perturbed away from the policy's own, so the corrections do work.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from support import random_groups, whole

from streamrl.config import Config, load_config
from streamrl.models import TINY, resolve_model
from streamrl.role_specs import LearnerSpec
from streamrl.workers.learning.batching import build_micro_batches
from streamrl.workers.learning.learner import Learner


def one_rank(config: Config, model_dir: str, checkpoint_dir: str = "checkpoints") -> Learner:
    """A learner group of one rank in this process, built from its spec as a run builds it;
    its shard and report endpoints lead nowhere (the tests call ``train_step`` directly)."""
    spec = LearnerSpec(
        log_file="",
        bind_host="127.0.0.1",
        config=config,
        rank=0,
        world_size=1,
        model_dir=model_dir,
        shard_endpoints=["tcp://127.0.0.1:9"],
        report_endpoint="tcp://127.0.0.1:9",
        checkpoint_dir=checkpoint_dir,
    )
    return Learner(spec, "127.0.0.1:0")  # a group of one: any free port


def _reference(chunk: list) -> dict[str, torch.Tensor]:
    """The response-aligned tensors of ``chunk`` by the obvious loop over Python lists."""
    longest = max(t.num_response_tokens for t in chunk)
    out = {
        "targets": torch.zeros((len(chunk), longest), dtype=torch.long),
        "mask": torch.zeros((len(chunk), longest)),
        "behavior": torch.zeros((len(chunk), longest)),
        "versions": torch.full((len(chunk), longest), -1, dtype=torch.long),
    }
    for i, t in enumerate(chunk):
        r = t.num_response_tokens
        out["targets"][i, :r] = torch.tensor(t.response_list())
        out["mask"][i, :r] = 1.0
        out["behavior"][i, :r] = torch.tensor(t.logprob_list())
        out["versions"][i, :r] = torch.tensor(t.version_list(), dtype=torch.long)
    return out


def _context(batch, b: int, j: int) -> tuple[list[int], list[int]]:
    """(tokens, positions) that the column predicting response token ``j`` of trajectory
    ``b`` attends to, in column order: what the model conditions that prediction on."""
    s = int(batch.source[b])
    column = batch.column(b, j)
    ids = batch.input_ids[s]
    if batch.attention is None:  # causal over one trajectory per sequence
        return ids[: column + 1].tolist(), list(range(column + 1))
    seen = batch.attention[s, column].nonzero().flatten()
    return ids[seen].tolist(), batch.positions[s, seen].tolist()


@pytest.mark.parametrize("shared", [False, True])
def test_micro_batches_condition_each_token_on_exactly_its_sampled_context(shared: bool) -> None:
    """``build_micro_batches`` (vectorised, from the raw bytes), in either layout: per-token
    tensors equal the obvious loop's, and the column that predicts response token j of a
    trajectory sees exactly its prompt and its first j response tokens, at positions 0, 1, ...
    (the context the generator sampled it in), and the next token is the target."""
    groups = random_groups(3, 4, seed=7, shared_prompt=shared)
    empty = groups[0].trajectories[2]
    empty.response_ids = empty.behavior_logprobs = empty.token_versions = b""
    batches = build_micro_batches(groups, size=5, pad_id=0, share_prompts_hidden=64 * shared)
    trajectories = [t for g in groups for t in g.trajectories]
    assert [len(b) for b in batches] == [5, 5, 2]
    assert [b.shares_prompts for b in batches] == [shared] * 3
    for n, batch in enumerate(batches):
        chunk = trajectories[5 * n : 5 * n + 5]
        for name, expected in _reference(chunk).items():
            assert torch.equal(getattr(batch, name), expected), name
        if batch.kept is None:
            assert batch.keep == batch.input_ids.shape[1] - batch.start
            assert batch.start == min(t.num_prompt_tokens for t in chunk) - 1
        else:  # only the columns that predict a response token, ascending
            predictors = {
                batch.column(b, j)
                for b, t in enumerate(chunk)
                for j in range(t.num_response_tokens)
            }
            assert batch.kept.tolist() == sorted(predictors)
        for b, t in enumerate(chunk):
            for j in range(t.num_response_tokens):
                tokens, positions = _context(batch, b, j)
                assert tokens == t.prompt_list() + t.response_list()[:j]
                assert positions == list(range(t.num_prompt_tokens + j))
    if shared:  # a row per group's prompt at most (two may share one: all begin with id 1)
        assert all(len(b.input_ids) <= n for b, n in zip(batches, [2, 2, 1], strict=True))


def test_prompts_that_begin_alike_share_a_row_and_each_token_keeps_its_context() -> None:
    """Prompts that begin with the same tokens (a chat template's system prompt) are packed
    as a prefix tree: fewer rows than prompts, and the column that predicts response token j
    of a trajectory still sees exactly its own prompt and first j response tokens, at the
    positions they were sampled at; only the columns that predict a token are kept."""
    groups = random_groups(6, 3, seed=11, shared_prompt=True, preamble=24)
    (batch,) = build_micro_batches(groups, size=18, pad_id=0, share_prompts_hidden=512)
    trajectories = [t for g in groups for t in g.trajectories]
    assert batch.shares_prompts and len(batch.input_ids) < len(groups)
    for name, expected in _reference(trajectories).items():
        assert torch.equal(getattr(batch, name), expected), name
    predictors = set()
    for b, t in enumerate(trajectories):
        for j in range(t.num_response_tokens):
            tokens, positions = _context(batch, b, j)
            assert tokens == t.prompt_list() + t.response_list()[:j]
            assert positions == list(range(t.num_prompt_tokens + j))
            predictors.add(batch.column(b, j))
    assert batch.kept.tolist() == sorted(predictors)
    assert len(batch.kept) < batch.input_ids.shape[1] - batch.start


@pytest.fixture(scope="module")
def model_dir() -> str:
    return str(resolve_model(TINY))


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_the_shared_prompt_mask_comes_in_the_forward_dtype(model_dir: str, attention) -> None:
    """The 4-D mask has the compute dtype it is asked for (a float32 mask beside bf16
    queries is misread by SDPA's cuDNN backend on Hopper GPUs: ``batching.model_inputs``),
    and on a CPU a bf16 forward gives the same logits with it as with a float32 mask."""
    from streamrl.models import load_causal_lm

    groups = random_groups(2, 4, seed=3, shared_prompt=True)
    (batch,) = build_micro_batches(groups, size=8, pad_id=0, share_prompts_hidden=64)
    model = load_causal_lm(resolve_model(TINY), dtype="bfloat16").eval()
    model.set_attn_implementation(attention)
    logits = {}
    for dtype in (torch.bfloat16, torch.float32):
        inputs = batch.model_inputs(dtype)
        assert inputs["attention_mask"].dtype == dtype
        with torch.no_grad():
            logits[dtype] = model(**inputs).logits
    assert torch.equal(logits[torch.bfloat16], logits[torch.float32])


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.correction=none", "algorithm.allow_uncorrected=true"],
        ["algorithm.correction=token-tis"],
        ["algorithm.correction=seq-tis"],
        ["algorithm.correction=token-mask"],
        ["algorithm.correction=seq-mask", "algorithm.is_cap=1.5"],
        ["algorithm.proximal=behavior", "algorithm.dual_clip=3.0", "algorithm.clip_high=0.28"],
        ["algorithm.advantage=rloo", "algorithm.loss_agg=seq-mean-token-sum-norm"],
        [
            "algorithm.advantage=dr_grpo",
            "algorithm.loss_agg=seq-mean-token-mean",
            "algorithm.entropy_coef=0.01",
            "algorithm.kl.coef=0.05",
            "algorithm.kl.kind=k3",
        ],
        ["algorithm.advantage=gae", "algorithm.lam=0.9", "algorithm.critic_lr=1e-3"],
        [
            "algorithm.kl.coef=0.1",
            "algorithm.kl.in_reward=true",
            "algorithm.kl.kind=k1",
            "algorithm.kl.adaptive_target=0.01",
        ],
    ],
    ids=lambda o: ",".join(x.split(".", 1)[1] for x in o),
)
def test_each_loss_option_trains_without_nan(model_dir: str, overrides: list[str]) -> None:
    config = load_config(
        None,
        [
            "model.name=tiny-random-llama",
            "learner.lr=1e-3",
            "learner.micro_batch_size=4",
            *overrides,
        ],
    )
    learner = one_rank(config, model_dir)
    try:
        before = {n: whole(p.detach()).clone() for n, p in learner.model.named_parameters()}
        for step in range(3):
            metrics = learner.train_step(random_groups(4, 4, seed=step), step)
            assert all(math.isfinite(v) for v in metrics.values()), metrics
        changed = [
            n
            for n, p in learner.model.named_parameters()
            if not torch.equal(before[n], whole(p.detach()))
        ]
        # Every parameter received gradient and moved (TRL-style smoke check).
        assert len(changed) == len(before), set(before) - set(changed)
    finally:
        learner.close()
        assert not dist.is_initialized()


def test_adaptive_kl_coefficient_is_fed_the_true_kl_and_checkpointed(
    model_dir: str, tmp_path
) -> None:
    """The adaptive controller moves by samples per step (not 1) and survives a resume."""
    overrides = [
        "model.name=tiny-random-llama",
        "learner.lr=1e-2",
        "algorithm.kl.coef=0.1",
        "algorithm.kl.adaptive_target=1e-6",
        "algorithm.kl.adaptive_horizon=100",
    ]

    def learner(*more: str) -> Learner:
        config = load_config(None, [*overrides, *more])
        return one_rank(config, model_dir, checkpoint_dir=str(tmp_path))

    first = learner()
    try:
        for step in range(2):
            metrics = first.train_step(random_groups(4, 4, seed=step), step)
        # Step 1: policy == reference, KL 0 < target: -20% x 16 samples / 100 horizon.
        # Step 2: KL > 0, far above the target: +20% x 16 / 100.
        assert metrics["kl/ref"] > 0
        expected = 0.1 * (1 - 0.2 * 16 / 100) * (1 + 0.2 * 16 / 100)
        assert metrics["kl/coef"] == pytest.approx(expected)
        first.version = 2
        first.save_checkpoint()
    finally:
        first.close()
    resumed = learner("run.resume=true")
    try:
        assert resumed.version == 2
        assert resumed.kl_controller.value == pytest.approx(expected)
    finally:
        resumed.close()


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_a_packed_row_gives_the_logprobs_and_gradients_of_one_trajectory_per_row(
    model_dir: str, attention: str
) -> None:
    """The prefix-tree layout computes what one trajectory per sequence does: every response
    token's logprob, and the gradient of their sum, to float32 rounding (tiny model)."""
    from streamrl.models import load_causal_lm

    groups = random_groups(6, 3, seed=11, shared_prompt=True, preamble=24)
    model = load_causal_lm(resolve_model(TINY), dtype="float32")
    model.set_attn_implementation(attention)
    results = []
    for hidden in (512, 0):
        (batch,) = build_micro_batches(groups, size=18, pad_id=0, share_prompts_hidden=hidden)
        assert batch.shares_prompts == (hidden > 0)
        model.zero_grad(set_to_none=True)
        logits = batch.gather(
            model(**batch.model_inputs(torch.float32), logits_to_keep=batch.keep).logits
        )
        logprobs = torch.log_softmax(logits, -1).gather(-1, batch.targets[..., None])[..., 0]
        (logprobs * batch.mask).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((logprobs.detach() * batch.mask, grads))
    (packed, packed_grads), (plain, plain_grads) = results
    assert torch.allclose(packed, plain, atol=1e-5)
    assert (packed_grads - plain_grads).norm() <= 1e-5 * plain_grads.norm()
