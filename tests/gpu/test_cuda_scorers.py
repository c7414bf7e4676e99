"""Served rewards on a GPU (docs/design.md §7c; ``--gpus-per-reward``): the reward model and
the judge score on CUDA as on the CPU, and Bradley-Terry training learns on CUDA. Skipped
without CUDA; run on a lent GPU machine by ``scripts/gpu_check.sh tests``."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from streamrl.config import JudgeSpec
from streamrl.models import resolve_model
from streamrl.rewards.model import RewardModelScorer
from streamrl.rewards.model_training import Pair, train_reward_model
from streamrl.rewards.scorer import ScoreItem
from streamrl.workers.reward_roles.judge import JudgeScorer

pytestmark = pytest.mark.gpu

ITEMS = [
    ScoreItem("What is 12 + 8?", "12 + 8 = 20", "20"),
    ScoreItem("What is 12 + 8?", "12 + 8 = 19. Let me explain why in detail", "20"),
    ScoreItem("Calculate 3 - 5.", "-2", "-2"),
]


def test_a_reward_model_scores_on_cuda_as_on_the_cpu() -> None:
    model_dir = resolve_model("tiny-random-reward")
    cpu = RewardModelScorer(model_dir, "rm", dtype=torch.float32).score(ITEMS)
    cuda = RewardModelScorer(model_dir, "rm", device="cuda", dtype=torch.float32).score(ITEMS)
    assert cuda == pytest.approx(cpu, abs=1e-3)


def test_a_judge_scores_on_cuda_as_on_the_cpu() -> None:
    spec = JudgeSpec(
        model="tiny-random-llama", yes_tokens=["1"], no_tokens=["0"], min_verdict_mass=0.0
    )
    model_dir = resolve_model("tiny-random-llama")
    cpu = JudgeScorer(spec, model_dir, "judge").score(ITEMS)
    cuda = JudgeScorer(spec, model_dir, "judge", device="cuda").score(ITEMS)
    assert cuda == pytest.approx(cpu, abs=1e-3)


def test_bradley_terry_training_learns_on_cuda(tmp_path: Path) -> None:
    rng = random.Random(0)
    pairs = []
    for _ in range(160):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        pairs.append(Pair(f"What is {a} + {b}?", f"{a} + {b} = {a + b}", f"{a} + {b} = lots"))
    figures = train_reward_model(
        pairs,
        "tiny-random-reward",
        tmp_path / "rm",
        epochs=2,
        lr=1e-3,
        held_out=0.25,
        device="cuda",
        log=print,
    )
    print(f"cuda Bradley-Terry: {figures}")
    assert figures["accuracy_after"] >= 0.9
