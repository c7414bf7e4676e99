"""Algorithm-side reward shaping and the torch-free group filter, against Python references."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from streamrl.algorithms import rewards
from streamrl.algorithms.group_filter import has_reward_variance


def ref_overlong(length: int, max_len: int, buffer_len: int, factor: float) -> float:
    expected_len = max_len - buffer_len
    if length <= expected_len:
        return 0.0
    if length <= max_len:
        return (expected_len - length) / buffer_len * factor
    return -factor


@pytest.mark.parametrize(
    ("max_len", "buffer_len", "factor"), [(20, 8, 1.0), (20, 1, 0.5), (16, 16, 2.0)]
)
def test_overlong_penalty_matches_reference(max_len: int, buffer_len: int, factor: float) -> None:
    lengths = torch.arange(0, max_len + 6)
    expected = [ref_overlong(n, max_len, buffer_len, factor) for n in lengths.tolist()]
    got = rewards.overlong_penalty(lengths, max_len, buffer_len, factor)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, torch.tensor(expected))


def test_overlong_penalty_hand_computed_and_hard_version() -> None:
    # max 100, buffer 20: 80 is free, 90 is halfway down the ramp, 100 is -1, 120 is -1.
    got = rewards.overlong_penalty(torch.tensor([50, 80, 90, 100, 120]), 100, 20)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))
    hard = rewards.overlong_penalty(torch.tensor([99, 100, 101]), 100, 0, factor=3.0)
    torch.testing.assert_close(hard, torch.tensor([0.0, 0.0, -3.0]))
    with pytest.raises(ValueError):
        rewards.overlong_penalty(torch.tensor([1]), 10, 11)


def test_has_reward_variance() -> None:
    assert has_reward_variance([1, 0])
    assert not has_reward_variance([1, 1])
    assert not has_reward_variance([0.5])
    assert not has_reward_variance([])
    assert has_reward_variance([0.0, 0.0, 1e-9])
    assert not has_reward_variance([0.0, 0.0, 1e-9], tol=1e-6)


def test_group_filter_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import streamrl.algorithms\n"
        "from streamrl.algorithms.group_filter import has_reward_variance\n"
        "import streamrl.buffers.replay\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    repo_root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=repo_root)


def test_longest_policy_turn_is_a_run_of_policy_tokens() -> None:
    assert rewards.longest_policy_turn(bytes([1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 0, 1]), 12) == 5
    assert rewards.longest_policy_turn(bytes([0, 0, 1, 0]), 4) == 1
    assert rewards.longest_policy_turn(b"", 7) == 7  # single-turn: the whole response


def _episode(turns: list[int], observation: int, reward: float = 1.0):
    """A trajectory of policy turns of the given lengths, ``observation`` environment tokens
    after each but the last (a single-turn response for one turn and no observation)."""
    from streamrl.protocol import Trajectory

    mask: list[int] = []
    for i, n in enumerate(turns):
        mask += [1] * n + ([0] * observation if i < len(turns) - 1 else [])
    t = Trajectory.from_lists(
        [1, 5], [7] * len(mask), [-1.0] * len(mask), [0] * len(mask), reward, "stop", 0,
        action_mask=mask if observation else None,
    )  # fmt: skip
    return t


def test_overlong_penalty_counts_each_policy_turn_not_the_episode() -> None:
    """max_new_tokens caps one policy turn: a tool-using episode of short turns (its
    environment tokens make it long) is not penalised; a direct answer cut at the cap is."""
    from types import SimpleNamespace

    from streamrl.config import load_config
    from streamrl.protocol import TrajectoryGroup
    from streamrl.workers.learning.step_figures import StepMetrics
    from streamrl.workers.learning.train_step import TrainStep

    root = Path(__file__).resolve().parents[2]
    config = load_config(
        root / "configs" / "tiny.yaml",
        ["generator.max_new_tokens=16", "algorithm.overlong_buffer.length=4"],
    )
    tool_use = _episode([6, 6, 6], observation=20)  # 58 tokens, 18 the policy's, turns of 6
    near_cap = _episode([6, 14], observation=20)  # its second turn ends in the buffer
    direct = _episode([16], observation=0)  # cut at max_new_tokens
    group = TrajectoryGroup("g", "p", [tool_use, near_cap, direct], 0.0, 0.0)
    step = SimpleNamespace(config=config, ref_model=None)  # what ``_scores`` reads
    scores = TrainStep._scores(step, [group], [], StepMetrics(torch.device("cpu")))  # type: ignore[arg-type]
    torch.testing.assert_close(scores, torch.tensor([1.0, 1.0 - 2 / 4, 0.0]))


def test_token_level_rewards() -> None:
    scores = torch.tensor([1.0, 2.0, 3.0])
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]])
    got = rewards.token_level_rewards(scores, mask)
    expected = torch.zeros(3, 5)
    expected[0, 3], expected[2, 0] = 1.0, 3.0
    torch.testing.assert_close(got, expected)

    kl = torch.full((3, 5), 0.5)
    with_kl = rewards.token_level_rewards(scores, mask, kl=kl, kl_coef=0.1)
    torch.testing.assert_close(with_kl, expected - 0.05 * mask)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_shaping_does_not_sync_on_cuda() -> None:
    lengths = torch.randint(0, 40, (64,), device="cuda")
    scores = torch.randint(2, (64,), device="cuda").float()
    mask = torch.rand(64, 16, device="cuda") > 0.3
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        rewards.overlong_penalty(lengths, 32, 8)
        rewards.token_level_rewards(scores, mask, kl=torch.rand_like(mask.float()), kl_coef=0.1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
