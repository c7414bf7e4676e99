"""The mismatch figures (``step_figures.mismatch_figures``): tokens that an in-flight update
reached mid-response are measured apart, so ``mismatch/*`` stays a check of the numerics."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from streamrl.workers.learning.learner import rendezvous
from streamrl.workers.learning.step_figures import StepMetrics, mismatch_figures


@pytest.fixture
def one_rank():
    store = rendezvous("127.0.0.1:0", 0, 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_tokens_sampled_after_an_in_flight_update_are_measured_apart(one_rank: None) -> None:
    version = 5
    # Row 0: all at version 5. Row 1: begun on 4, updated to 5 after two tokens (its KV cache
    # was written by 4). Row 2: all at 4 (not this step's weights). Padding: version -1.
    versions = torch.tensor([[5, 5, 5, -1], [4, 4, 5, 5], [4, 4, 4, 4]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.float32)
    behavior = torch.full((3, 4), -1.0)
    learner = behavior.clone()
    learner[0, :3] += torch.tensor([1e-6, -2e-6, 3e-6])  # rounding
    learner[1, 2:] += torch.tensor([0.3, -0.1])  # the stale KV cache's effect
    learner[2] += 0.5  # older weights: not measured at all
    batch = SimpleNamespace(behavior=behavior, mask=mask, versions=versions, guided=None)
    metrics = StepMetrics(torch.device("cpu"))
    mismatch_figures(batch, learner, version, metrics)  # type: ignore[arg-type]
    out = metrics.reduce()
    assert out["mismatch/tokens"] == 3
    assert out["mismatch/logprob_abs_max"] == pytest.approx(3e-6, rel=0.05)
    assert out["mismatch/logprob_abs_mean"] == pytest.approx(2e-6, rel=0.05)
    assert out["mismatch/after_update_tokens"] == 2
    assert out["mismatch/after_update_logprob_abs_mean"] == pytest.approx(0.2, rel=1e-5)


def test_a_guided_reference_response_is_not_measured(one_rank: None) -> None:
    """A reference response (``algorithm.guidance``) was never sampled: its zeros are not
    behaviour logprobs, so neither the mismatch nor the drift by lag counts its tokens."""
    versions = torch.tensor([[5, 5, 5], [5, 5, 5], [4, 4, 4]])
    mask = torch.ones(3, 3)
    behavior = torch.tensor([[-1.0, -1.0, -1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    learner = torch.full((3, 3), -1.0)
    guided = torch.tensor([False, True, True])
    batch = SimpleNamespace(behavior=behavior, mask=mask, versions=versions, guided=guided)
    metrics = StepMetrics(torch.device("cpu"))
    mismatch_figures(batch, learner, 5, metrics)  # type: ignore[arg-type]
    out = metrics.reduce()
    assert out["mismatch/tokens"] == 3 and out["mismatch/logprob_abs_max"] == 0.0
    assert out.get("drift/k3_lag1", 0.0) == 0.0
