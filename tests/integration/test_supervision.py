"""Supervision on real tiny runs: a generator killed with -9 or SIGSTOPped is replaced, and
``generator.count`` scales live; each run reaches its last step with nothing lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from support import alive, launch_tiny, wait_for

from streamrl.cli import main as cli

pytestmark = pytest.mark.slow


def _launch(run_dir: Path, steps: int) -> subprocess.Popen:
    return launch_tiny(run_dir, f"run.max_steps={steps}", "run.heartbeat_timeout_s=5")


def _steps(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    steps = [json.loads(line).get("step", 0) for line in path.read_text().splitlines() if line]
    return max(steps, default=0)


def _pid_of(run_dir: Path, role: str) -> int:
    return json.loads((run_dir / "pids.json").read_text())["by_role"][role]


def _finish(proc: subprocess.Popen, run_dir: Path) -> tuple[str, dict]:
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    pids = json.loads((run_dir / "pids.json").read_text())
    left = [pid for pid in pids["roles"] if alive(pid)]
    assert not left, f"role processes outlived the run: {left} of {pids}"
    return out, json.loads((run_dir / "summary.json").read_text())


def _assert_nothing_lost(summary: dict) -> None:
    """Every group a shard accepted was consumed, dropped for a counted reason, or is still
    there: accepted = consumed + dropped + remaining, exactly."""
    for shard in summary["buffer"]:
        rest = shard["consumed"] + sum(shard["dropped"].values()) + shard["size"] + shard["held"]
        assert shard["ingested"] == rest, shard


def _events(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == kind]


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["kill-9", "sigstop"])
def test_a_lost_generator_is_replaced_and_the_run_finishes(tmp_path: Path, how: int) -> None:
    run_dir = tmp_path / "run"
    proc = _launch(run_dir, 12)
    wait_for(lambda: proc.poll() is not None or _steps(run_dir) >= 3, 240, "step 3")
    assert proc.poll() is None
    victim = _pid_of(run_dir, "generator 1")
    if how == signal.SIGSTOP:
        # Paused, the run cannot finish on generator 0 alone before the silence is noticed.
        assert cli(["admin", "pause", "--run", str(run_dir)]) == 0
    os.kill(victim, how)
    if how == signal.SIGSTOP:
        wait_for(lambda: _events(run_dir, "restart"), 60, "the silent generator replaced")
        assert cli(["admin", "resume", "--run", str(run_dir)]) == 0
    out, summary = _finish(proc, run_dir)
    assert summary["version"] == 12
    assert summary["restarts"] == {"generator 1": 1}
    assert "generator 1:" in out and "replaced (restart 1/3)" in out
    (restart,) = _events(run_dir, "restart")
    expected = "no heartbeat" if how == signal.SIGSTOP else ""
    assert expected in restart["failure"]
    assert not alive(victim)
    _assert_nothing_lost(summary)


def test_generator_count_scales_live(tmp_path: Path) -> None:
    """2 -> 3 -> 1 generators through the admin endpoint; the run finishes, nothing lost.
    Each change is made while admission is paused, so the tiny run (several steps a second)
    cannot end before it takes effect."""
    run_dir = tmp_path / "run"
    proc = _launch(run_dir, 40)

    def admin(*args: str) -> None:
        assert cli(["admin", *args, "--run", str(run_dir)]) == 0

    def generator_pids() -> dict[str, int]:
        by_role = json.loads((run_dir / "pids.json").read_text())["by_role"]
        return {role: pid for role, pid in by_role.items() if role.startswith("generator")}

    try:
        wait_for(lambda: proc.poll() is not None or _steps(run_dir) >= 2, 240, "step 2")
        admin("pause")
        admin("set", "generator.count=3")
        wait_for(lambda: "generator 2" in generator_pids(), 120, "generator 2 started")
        third, second = generator_pids()["generator 2"], generator_pids()["generator 1"]
        admin("resume")
        at = _steps(run_dir)
        wait_for(lambda: _steps(run_dir) >= at + 3, 240, "three steps with 3 generators")
        admin("pause")
        admin("set", "generator.count=1")
        wait_for(lambda: not alive(third) and not alive(second), 120, "generators 1, 2 retired")
        admin("resume")
    except BaseException:
        proc.kill()
        raise
    out, summary = _finish(proc, run_dir)
    assert summary["version"] == 40
    assert "generator 2: started" in out and "generator 2: retired" in out
    assert "generator 1: retired" in out
    assert summary["restarts"] == {}
    _assert_nothing_lost(summary)
