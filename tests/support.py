"""Helpers shared by tests (importable because pytest puts tests/ on sys.path via conftest)."""

from __future__ import annotations

import contextlib
import json
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


# Fewer role processes, for a test whose subject is not how roles of one kind work together
# (FSDP2 across ranks, several generators, a sharded checkpoint keep two of each elsewhere).
# Each role is a process that imports torch and transformers: a 5-step tiny run with two
# learners and two generators costs about 36 CPU-seconds, with one of each about 19 (AMD EPYC,
# 2026-12-03); CI's two cores are busy throughout, so CPU-seconds are its wall time.
ONE_LEARNER = ("learner.count=1",)
ONE_GENERATOR = ("generator.count=1",)
ONE_OF_EACH = ONE_LEARNER + ONE_GENERATOR


def launch_tiny(
    run_dir: Path, *args: str, env: dict[str, str] | None = None, new_session: bool = False
) -> subprocess.Popen:
    """``streamrl launch configs/tiny.yaml`` into ``run_dir`` as a child process (output
    captured as text); ``args`` are more overrides or flags. ``new_session``: in a process
    group of its own (``os.killpg(proc.pid, ...)`` then ends exactly it)."""
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
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=new_session,
    )


def assert_still_running(proc: subprocess.Popen) -> None:
    """Fail, with the run's last output, if the launched run has already exited."""
    if proc.poll() is None:
        return
    out = proc.stdout.read() if proc.stdout else ""
    raise AssertionError(f"the run ended (exit {proc.returncode}) before the fault:\n{out[-4000:]}")


def replay_cli(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """``streamrl replay RUN_DIR ARGS...`` to its end (output captured as text)."""
    return subprocess.run(
        [sys.executable, "-m", "streamrl.cli", "replay", str(run_dir), *args],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        timeout=600,
    )


def wait_until(
    predicate: Callable[[], T], timeout: float = 20.0, what: str = "", every: float = 0.05
) -> T:
    """Call ``predicate`` every ``every`` seconds until it returns something true, and return
    that; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what or predicate}"
        time.sleep(every)


def make_group(
    gid: str,
    version: int = 0,
    *,
    rewards: tuple[float, ...] = (0.0, 1.0),
    tokens: int = 5,
    finished_at: float = 0.0,
):
    """A small ``TrajectoryGroup`` ``gid``: one trajectory per reward, each of ``tokens``
    tokens (the first ``tokens // 2`` the prompt, ids 1, 2, ...; the rest the response, every
    one sampled at ``version``, logprobs -0.1, -0.2, ...), created and finished at
    ``finished_at``. The default is 2 prompt and 3 response tokens."""
    from streamrl.protocol import Trajectory, TrajectoryGroup

    half = tokens // 2
    response = list(range(half + 1, tokens + 1))
    trajectories = [
        Trajectory.from_lists(
            prompt_ids=list(range(1, half + 1)),
            response_ids=response,
            behavior_logprobs=[-(k + 1) / 10 for k in range(len(response))],
            token_versions=[version] * len(response),
            reward=reward,
            finish_reason="stop",
            generator_id=0,
        )
        for reward in rewards
    ]
    return TrajectoryGroup(gid, f"p-{gid}", trajectories, finished_at, finished_at)


def ids(groups: list) -> list[str]:
    """The groups' ids, in order."""
    return [g.group_id for g in groups]


def random_groups(
    n_groups: int,
    group_size: int,
    seed: int,
    version: int = 0,
    *,
    shared_prompt: bool = False,
    preamble: int = 0,
) -> list:
    """Synthetic trajectory groups for the tiny model (ids 4..99): prompts of 4-8 tokens (one
    per group with ``shared_prompt``, as GRPO groups have, else one per trajectory),
    responses of 1-11, behaviour logprobs perturbed around -4.6 (so corrections do work),
    rewards in [0, 1), every token sampled at ``version``. ``preamble``: that many tokens
    begin every prompt alike (a chat template's system prompt)."""
    import random

    from streamrl.protocol import Trajectory, TrajectoryGroup

    rng = random.Random(seed)
    common = [1] + [rng.randrange(4, 100) for _ in range(preamble)]
    groups = []
    for g in range(n_groups):
        trajectories = []
        group_prompt = common + [rng.randrange(4, 100) for _ in range(rng.randrange(3, 8))]
        for _ in range(group_size):
            prompt = group_prompt
            if not shared_prompt:
                prompt = common + [rng.randrange(4, 100) for _ in range(rng.randrange(3, 8))]
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


# --------------------------------------------------------------------------- supervised runs


def steps_done(run_dir: Path) -> int:
    """The newest step in a run's metrics.jsonl (0 before the first)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    steps = [json.loads(line).get("step", 0) for line in path.read_text().splitlines() if line]
    return max(steps, default=0)


def pid_of(run_dir: Path, role: str) -> int:
    return json.loads((run_dir / "pids.json").read_text())["by_role"][role]


def events(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == kind]


@contextlib.contextmanager
def killed_on_error(proc: subprocess.Popen):
    """Kill the launched run (by its pid) if the block fails, so no test leaves it behind."""
    try:
        yield proc
    except BaseException:
        proc.kill()
        raise


def finish_run(
    proc: subprocess.Popen, run_dir: Path, timeout: float = 300, ended_within_s: float = 0.0
) -> tuple[str, dict]:
    """Wait for a launched run; it must exit 0 and leave none of its role processes alive.
    Returns its output and summary. ``ended_within_s``: a run joined to a cluster hands its
    actors to Ray to end (``ray.kill`` returns before the process has exited, and on a loaded
    node the exit can take seconds), so its roles get that long to be gone; a local run
    reaps its own before it returns, so they must be gone at once."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    pids = json.loads((run_dir / "pids.json").read_text())
    deadline = time.monotonic() + ended_within_s
    left = [pid for pid in pids["roles"] if alive(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [pid for pid in left if alive(pid)]
    assert not left, f"role processes outlived the run: {left} of {pids}"
    return out, json.loads((run_dir / "summary.json").read_text())


def assert_logs_exact(summary: dict, run_dir: Path) -> None:
    """Every shard's durable-log tallies hold over every process that served it (received ==
    removed by reason + remaining), and each group is on the log once."""
    from streamrl.buffers.log_history import scan_shard, shard_dirs

    for shard in summary["buffer"]:
        remaining = shard["size"] + shard["held"]
        assert shard["received_total"] == sum(shard["removed_total"].values()) + remaining, shard
    for shard_dir in shard_dirs(run_dir / "buffer"):
        ids = [group.group_id for group, _ in scan_shard(shard_dir)]
        assert len(ids) == len(set(ids)), f"{shard_dir}: a group logged twice"


def assert_nothing_lost(summary: dict, run_dir: Path) -> None:
    """Every group a shard received was consumed, dropped for a counted reason, or is still
    there, exactly (from the durable log's tallies, over every process that served the shard);
    each group id is on the log once; the learners trained on exactly the groups the shards
    handed out (the metrics' ``train/groups``); no group pushed by a generator was lost in
    transit (a killed shard's socket buffers: generators send those again, see
    ``buffers.delivery``)."""
    assert_logs_exact(summary, run_dir)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    trained = sum(r.get("train/groups", 0) for r in map(json.loads, lines) if "step" in r)
    consumed = sum(s["removed_total"].get("consumed", 0) for s in summary["buffer"])
    assert trained == consumed, f"trained {trained} groups, shards handed out {consumed}"
    assert summary["groups_lost_in_transit"] == 0, summary


def whole(tensor):
    """A parameter's or gradient's full value: an FSDP2 DTensor gathered, a plain tensor (one
    learner rank) as it is."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def learner_logprobs(model, prompt: list[int], response: list[int], temperature: float):
    """The learner's scoring of a sampled response: one uncached forward over prompt +
    response, ``losses.token_logprobs`` at the sampling temperature -> float32 [len(response)]
    on the CPU."""
    import torch

    from streamrl.algorithms.losses import token_logprobs

    ids = torch.tensor([prompt + response], device=model.device)
    logits = model(input_ids=ids).logits[:, len(prompt) - 1 : -1]
    targets = torch.tensor([response], device=model.device)
    return token_logprobs(logits, targets, temperature=temperature)[0].float().cpu()
