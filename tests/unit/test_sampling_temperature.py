"""A row is scored at its own sampling temperature whatever else shares its micro-batch.

After a live ``generator.temperature`` change a micro-batch mixes rows sampled at two
temperatures. Under a bf16 forward the learner once divided the bf16 logits by the
temperatures cast to bf16 (0.7 -> 0.69921875, and the quotient rounded to 8 bits), so a mixed
row's logprobs differed from the same row's alone; here they must agree to float precision.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from streamrl.config import load_config
from streamrl.protocol import Trajectory, TrajectoryGroup
from streamrl.workers.learning.batching import build_micro_batches
from streamrl.workers.learning.train_step import TrainStep

VOCAB = 128


class BF16Logits(torch.nn.Module):
    """A causal LM stand-in whose bf16 logits at a position depend only on that token, with
    the spread of a real model's (tens of nats), so bf16 rounding shows."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        table = torch.randn(VOCAB, VOCAB, generator=generator) * 8
        self.table = torch.nn.Parameter(table.to(torch.bfloat16))

    def forward(self, input_ids: torch.Tensor, logits_to_keep: int) -> SimpleNamespace:
        return SimpleNamespace(logits=self.table[input_ids][:, -logits_to_keep:])


def _trajectory(prompt: list[int], response: list[int], temperature: float) -> Trajectory:
    return Trajectory.from_lists(
        prompt_ids=prompt,
        response_ids=response,
        behavior_logprobs=[-1.0] * len(response),
        token_versions=[0] * len(response),
        reward=0.0,
        finish_reason="length",
        generator_id=0,
        temperature=temperature,
    )


def _response_logprobs(trajectories: list[Trajectory], row: int) -> torch.Tensor:
    model = BF16Logits()
    step = TrainStep(
        load_config(None),
        model,
        None,
        device=torch.device("cpu"),
        world_size=1,
        pad_id=0,
        compute_dtype=torch.bfloat16,
    )
    group = TrajectoryGroup("g", "p", trajectories, 0.0, 0.0)
    (batch,) = build_micro_batches([group], len(trajectories), pad_id=0)
    _, logprobs = step._logprobs(model, batch)
    assert logprobs.dtype == torch.float32
    return logprobs[row][batch.mask[row].bool()]


def test_a_row_in_a_mixed_temperature_micro_batch_scores_as_it_does_alone() -> None:
    cooled = _trajectory([1, 5, 9, 17], [33, 2, 71, 101, 64, 8], temperature=0.7)
    others = [
        _trajectory([1, 40, 41], [90, 91, 3, 12, 5], temperature=1.0),
        _trajectory([1, 7, 7, 7, 7], [55, 23, 11], temperature=1.3),
    ]
    alone = _response_logprobs([cooled], row=0)
    mixed = _response_logprobs([others[0], cooled, others[1]], row=1)
    assert alone.shape == (6,)
    torch.testing.assert_close(mixed, alone, rtol=1e-6, atol=1e-6)
