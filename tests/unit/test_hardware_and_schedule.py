"""Compute dtype by capability, the learning-rate schedule, and the new config checks."""

from __future__ import annotations

import pytest

from streamrl import hardware
from streamrl.config import ConfigError, load_config
from streamrl.workers.learning.train_step import lr_multiplier


def test_auto_is_float32_where_bf16_is_reported_unsupported(monkeypatch) -> None:
    monkeypatch.setattr(hardware, "cpu_bf16_is_fast", lambda: False)
    assert hardware.resolve_compute_dtype("auto", "cpu") == "float32"
    monkeypatch.setattr(hardware, "cpu_bf16_is_fast", lambda: True)
    assert hardware.resolve_compute_dtype("auto", "cpu") == "bfloat16"


def test_auto_is_bf16_on_cuda_and_explicit_choices_stand() -> None:
    assert hardware.resolve_compute_dtype("auto", "cuda:0") == "bfloat16"
    assert hardware.resolve_compute_dtype("auto", "cpu", bf16_fast=False) == "float32"
    assert hardware.resolve_compute_dtype("bfloat16", "cpu", bf16_fast=False) == "bfloat16"
    assert hardware.resolve_compute_dtype("float32", "cuda") == "float32"
    assert "compute dtype" in hardware.describe_choice("float32", "auto", "cpu")


def test_lr_warmup_then_cosine() -> None:
    config = load_config(
        None,
        [
            "run.max_steps=12",
            "learner.warmup_steps=4",
            "learner.lr_schedule=cosine",
            "learner.min_lr_ratio=0.1",
        ],
    )
    values = [lr_multiplier(v, config) for v in range(14)]
    assert values[:4] == [0.25, 0.5, 0.75, 1.0]
    assert values[4] == pytest.approx(1.0) and values[8] == pytest.approx(0.55)
    assert values[12] == values[13] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(values[3:], values[4:], strict=False))
    constant = load_config(None, ["learner.warmup_steps=2"])
    assert [lr_multiplier(v, constant) for v in range(4)] == [0.5, 1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["generator.top_p=0.9"], "top_p/top_k truncate"),
        (["generator.top_k=50"], "top_p/top_k truncate"),
        (["learner.mini_batches=3"], "divisible by learner.mini_batches"),
        (["learner.ppo_epochs=0"], "ppo_epochs"),
        (["learner.micro_batch_tokens=-1"], "micro_batch_tokens must be >= 0"),
        (["algorithm.overlong_buffer.length=999"], "overlong_buffer.length"),
        (["buffer.capacity_tokens=0"], "capacity_tokens"),
        (["model.compute_dtype=float16"], "compute_dtype"),
    ],
)
def test_config_refuses(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_adamw_is_fused_on_cuda_and_cpu_and_multi_tensor_elsewhere() -> None:
    import torch

    from streamrl.workers.learning.fsdp import adamw

    params = [torch.nn.Parameter(torch.randn(3))]
    for device in ("cuda", "cpu"):
        optimizer = adamw(params, 1e-5, (0.9, 0.999), 0.0, torch.device(device))
        assert optimizer.defaults["fused"] and not optimizer.defaults["foreach"], device
    other = adamw(params, 1e-5, (0.9, 0.999), 0.0, torch.device("mps"))
    assert other.defaults["foreach"] and not other.defaults["fused"]
