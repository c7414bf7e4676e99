"""The CUDA path on a real GPU: NCCL learner rank, HF engine on CUDA, learner = engine.

Needs CUDA (skipped otherwise). Models are built from configs with random weights
(``tiny-random-llama``, and ``random-smollm2-135m`` for the bf16 consistency figure), since a
GPU machine may have no hub and no GGUF package.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from support import learner_logprobs, whole

from streamrl.config import load_config
from streamrl.models import TINY, load_causal_lm, load_tokenizer, resolve_model
from streamrl.protocol import Trajectory, TrajectoryGroup
from streamrl.workers.engines.base import EngineArgs, SamplingParams
from streamrl.workers.engines.hf import HFEngine
from streamrl.workers.learning.learner import build_train_step, rendezvous

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda", 0)


@pytest.fixture
def nccl_group():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.cuda.set_device(0)
    store = rendezvous("127.0.0.1:0", 0, 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _sampled_groups(model_dir, engine: HFEngine, n_groups: int, seed: int) -> list:
    tokenizer = load_tokenizer(model_dir)
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for g in range(n_groups):
        prompt = [1] + torch.randint(
            4, 100, (int(torch.randint(3, 12, (1,), generator=gen)),), generator=gen
        ).tolist()
        params = SamplingParams(
            temperature=0.9, max_new_tokens=16, stop_token_ids=(tokenizer.eos_token_id,)
        )
        outs = engine.generate([prompt] * 4, params)
        trajectories = [
            Trajectory.from_lists(
                prompt,
                o.response_ids,
                o.logprobs,
                o.token_versions,
                reward=float(i % 2),
                finish_reason=o.finish_reason,
                generator_id=0,
                temperature=0.9,
            )
            for i, o in enumerate(outs)
        ]
        groups.append(TrajectoryGroup(f"g{seed}-{g}", f"p{g}", trajectories, 0.0, 0.0))
    return groups


@pytest.mark.parametrize(
    ("model", "dtype", "tolerance", "share_prompts"),
    [
        (TINY, "float32", 1e-3, True),
        ("random-smollm2-135m", "float32", 1e-3, True),
        # 2026-11-26, H100, torch 2.11.0+cu130, before the shared-prompt mask was made in the
        # compute dtype (batching.model_inputs): mean 0.58, max 2.0 (CPU, the same model and
        # samples: mean 0.0066, max 0.026). Without shared prompts there is no mask at all.
        ("random-smollm2-135m", "bfloat16", 0.5, True),
        ("random-smollm2-135m", "bfloat16", 0.5, False),
    ],
)
def test_nccl_learner_scores_what_the_cuda_engine_sampled(
    nccl_group, model, dtype, tolerance, share_prompts
):
    """One NCCL rank trains on samples of the HF engine on CUDA: every parameter moves, no
    NaN, and the on-policy mismatch is at the noise level of the dtype."""
    model_dir = resolve_model(model)
    engine = HFEngine(EngineArgs(model_dir, device="cuda", dtype=dtype, seed=0))
    groups = _sampled_groups(model_dir, engine, 4, seed=0)
    config = load_config(
        None,
        [
            f"model.name={model}",
            f"model.compute_dtype={dtype}",
            "learner.device=cuda",
            "learner.backend=nccl",
            "learner.lr=1e-3",
            "learner.micro_batch_size=8",
            f"learner.share_prompts={str(share_prompts).lower()}",
        ],
    )
    step = build_train_step(config, model_dir, CUDA, 1)
    before = {n: whole(p.detach()).clone() for n, p in step.policy.named_parameters()}
    metrics = step(groups, version=0)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["mismatch/tokens"] > 0
    assert metrics["mismatch/logprob_abs_max"] <= tolerance, metrics
    moved = [
        n
        for n, p in step.policy.named_parameters()
        if not torch.equal(before[n], whole(p.detach()))
    ]
    assert len(moved) == len(before)
    print(
        f"{model} {dtype} share_prompts={share_prompts}: mismatch mean "
        f"{metrics['mismatch/logprob_abs_mean']:.2e} "
        f"max {metrics['mismatch/logprob_abs_max']:.2e} is_weight_max "
        f"{metrics['policy/is_weight_max']:.4f}"
    )


def test_cuda_engine_takes_weight_updates_in_flight():
    """The engine on CUDA applies a host bf16 update between decode steps: tokens after it
    carry the new version and the sequence goes on."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    engine = HFEngine(EngineArgs(resolve_model(TINY), device="cuda", dtype="bfloat16", seed=0))
    assert engine.shared_weights() is None  # the subscriber keeps a host image on a GPU
    name, param = next(iter(engine.params.items()))
    new = (param.detach().cpu() + 0.5).to(torch.bfloat16)
    calls = []

    def on_step(e):
        calls.append(1)
        if len(calls) == 3:
            e.update_weights([(name, new)], version=1)

    (out,) = engine.generate([[1, 5, 6, 7]], SamplingParams(max_new_tokens=8), on_step)
    assert out.token_versions[:3] == [0, 0, 0] and set(out.token_versions[3:]) == {1}
    assert torch.equal(engine.params[name].detach().cpu(), new)


def test_cuda_engine_adopts_an_update_prepared_on_another_thread():
    """The weight thread's path on CUDA: ``prepare_weights`` copies the host tensors to new
    device tensors on another thread while the engine decodes (its samples meanwhile are the
    held weights'), and the adoption between decode steps swaps them in: afterwards the
    engine samples exactly what ``update_weights`` with the same tensors gives."""
    import threading

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    engine = HFEngine(EngineArgs(resolve_model(TINY), device="cuda", dtype="bfloat16", seed=0))
    original = {n: p.detach().cpu().clone() for n, p in engine.params.items()}
    gen = torch.Generator().manual_seed(0)
    new = {
        n: (t.float() * (1 + 0.05 * torch.randn(t.shape, generator=gen))).to(torch.bfloat16)
        for n, t in list(original.items())[:6]
    }
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=5)
    prompts = [[1, 5, 6, 7], [2, 3]]

    def sample():
        return [(o.response_ids, o.logprobs) for o in engine.generate(prompts, params)]

    before = sample()
    engine.update_weights(list(new.items()), version=1)
    updated = sample()
    engine.update_weights(list(original.items()), version=2)
    prepared = []
    thread = threading.Thread(
        target=lambda: prepared.append(engine.prepare_weights(list(new.items()), 3))
    )
    thread.start()
    during = sample()
    thread.join()
    assert [t for t, _ in during] == [t for t, _ in before] and engine.version == 2
    prepared[0]()
    assert engine.version == 3
    after = sample()
    for (ta, la), (tb, lb) in zip(after, updated, strict=True):
        assert ta == tb
        torch.testing.assert_close(torch.tensor(la), torch.tensor(lb), atol=1e-5, rtol=0)
    for name, tensor in new.items():
        assert torch.equal(engine.params[name].detach().cpu(), tensor)


def test_cuda_engine_logprobs_match_an_fp32_forward():
    """The engine's bf16 behaviour logprobs on CUDA against a plain fp32 transformers forward
    of each whole sequence (eager attention, no cache, no padding): within bf16 noise. With
    the learner test above this tells which side leaves the noise level when they disagree."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model_dir = resolve_model("random-smollm2-135m")
    engine = HFEngine(EngineArgs(model_dir, device="cuda", dtype="bfloat16", seed=0))
    groups = _sampled_groups(model_dir, engine, 2, seed=1)
    reference = load_causal_lm(model_dir, dtype="float32", device="cuda").eval()
    gaps = []
    with torch.no_grad():
        for t in (t for group in groups for t in group.trajectories):
            exact = learner_logprobs(reference, t.prompt_list(), t.response_list(), t.temperature)
            gaps.append((exact - torch.tensor(t.logprob_list())).abs())
    gap = torch.cat(gaps)
    print(f"engine bf16 vs fp32 forward: mean {gap.mean():.2e} max {gap.max():.2e}")
    assert gap.max() <= 0.5 and gap.mean() <= 0.05
