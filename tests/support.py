"""Helpers shared by tests (importable because pytest puts tests/ on sys.path via conftest)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def alive(pid: int) -> bool:
    """Whether a process we started still exists (never signals anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def launch_tiny(run_dir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``streamrl launch configs/tiny.yaml`` into ``run_dir`` as a child process (output
    captured as text); ``args`` are more overrides or flags."""
    cmd = [
        str(Path(sys.executable).parent / "streamrl"),
        "launch",
        str(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"),
        f"run.output_dir={run_dir.parent}",
        f"--name={run_dir.name}",
        "logging.progress=false",
        *args,
    ]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def wait_for(predicate: Callable[[], T], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def random_groups(n_groups: int, group_size: int, seed: int, version: int = 0) -> list:
    """Synthetic trajectory groups for the tiny model (ids 4..99): prompts of 4-8 tokens,
    responses of 1-11, behaviour logprobs perturbed around -4.6 (so corrections do work),
    rewards in [0, 1), every token sampled at ``version``."""
    import random

    from streamrl.protocol import Trajectory, TrajectoryGroup

    rng = random.Random(seed)
    groups = []
    for g in range(n_groups):
        trajectories = []
        for _ in range(group_size):
            prompt = [1] + [rng.randrange(4, 100) for _ in range(rng.randrange(3, 8))]
            length = rng.randrange(1, 12)
            trajectories.append(
                Trajectory.from_lists(
                    prompt_ids=prompt,
                    response_ids=[rng.randrange(4, 100) for _ in range(length)],
                    behavior_logprobs=[-4.6 + rng.uniform(-1.5, 1.5) for _ in range(length)],
                    token_versions=[version] * length,
                    reward=rng.random(),
                    finish_reason="length",
                    generator_id=0,
                )
            )
        groups.append(TrajectoryGroup(f"g{seed}-{g}", f"p{g}", trajectories, 0.0, 0.0))
    return groups
