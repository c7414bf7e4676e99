"""LoRA and the architecture matrix on a real GPU: an NCCL learner rank on CUDA against the HF
engine on CUDA. Skipped without CUDA; run on a lent GPU machine by ``scripts/gpu_check.sh``.

- LoRA (r = 16, all linear layers) on the SmolLM2-135M architecture in bf16: three rounds of
  sample -> train -> publish the adapters -> merge into the engine; each round's learner
  scores the engine's samples at staleness 0 to the bf16 noise level, only adapters move.
- Every tiny architecture (``streamrl.models.tiny``): the learner's fp32 logprobs on the
  engine's samples at staleness 0 to fp32 noise, and a training step with finite figures.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from test_cuda_path import _sampled_groups, nccl_group  # noqa: F401 (a fixture)

from streamrl.config import load_config
from streamrl.models import resolve_model
from streamrl.models.lora import (
    LoraMerge,
    adapter_settings,
    load_adapter_image,
    write_initial_adapter,
)
from streamrl.models.tiny import ARCHITECTURES
from streamrl.workers.engines.base import EngineArgs
from streamrl.workers.engines.hf import HFEngine
from streamrl.workers.learning.learner import build_train_step
from streamrl.workers.learning.shard_image import local_bf16_shards

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda", 0)


def _config(model: str, dtype: str, *extra: str):
    return load_config(
        None,
        [
            f"model.name={model}",
            f"model.compute_dtype={dtype}",
            "learner.device=cuda",
            "learner.backend=nccl",
            "learner.micro_batch_size=8",
            *extra,
        ],
    )


@pytest.mark.usefixtures("nccl_group")
def test_lora_rounds_on_cuda_stay_at_noise(tmp_path: Path):
    model = "random-smollm2-135m"
    model_dir = resolve_model(model)
    config = _config(model, "bfloat16", "learner.lr=2e-3", "model.lora={r: 16, alpha: 32}")
    adapter_dir = write_initial_adapter(config, model_dir, tmp_path)
    step = build_train_step(config, model_dir, CUDA, 1, adapter_dir=adapter_dir)
    engine = HFEngine(EngineArgs(model_dir, device="cuda", dtype="bfloat16", seed=0))
    adapters = load_adapter_image(adapter_dir)
    merge = LoraMerge(model_dir, adapters, adapter_settings(config))
    frozen = {
        n: p.detach().clone() for n, p in step.policy.named_parameters() if not p.requires_grad
    }
    first = {n: t.clone() for n, t in adapters.items()}
    for version in range(3):
        groups = _sampled_groups(model_dir, engine, 4, seed=version)
        metrics = step(groups, version=version)
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        assert metrics["mismatch/logprob_abs_max"] <= 0.5, metrics
        print(
            f"lora round {version}: mismatch mean {metrics['mismatch/logprob_abs_mean']:.2e} "
            f"max {metrics['mismatch/logprob_abs_max']:.2e} k3 {metrics['mismatch/k3']:.2e}"
        )
        for name, shard in local_bf16_shards(step.policy, 0).items():  # what is published
            adapters[name] = (
                torch.from_numpy(shard.bits).view(torch.bfloat16).view(shard.full_shape)
            )
        engine.update_weights(merge.merged(adapters), version + 1)
    assert any(not torch.equal(first[n], adapters[n]) for n in adapters if ".lora_B." in n)
    for name, param in step.policy.named_parameters():
        if not param.requires_grad:
            assert torch.equal(frozen[name], param.detach()), name


@pytest.mark.usefixtures("nccl_group")
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_every_architecture_learner_matches_the_cuda_engine(arch: str):
    model_dir = resolve_model(arch)
    engine = HFEngine(EngineArgs(model_dir, device="cuda", dtype="float32", seed=0))
    groups = _sampled_groups(model_dir, engine, 2, seed=0)
    step = build_train_step(_config(arch, "float32", "learner.lr=1e-3"), model_dir, CUDA, 1)
    metrics = step(groups, version=0)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["mismatch/tokens"] > 0
    print(
        f"{arch} fp32: mismatch mean {metrics['mismatch/logprob_abs_mean']:.2e} "
        f"max {metrics['mismatch/logprob_abs_max']:.2e}"
    )
    assert metrics["mismatch/logprob_abs_max"] <= 1e-3, metrics
