"""Elastic generators on a real tiny run: ``generator.count`` scales live and the run reaches
its last step with nothing lost (faults injected: ``tests/chaos``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support import (
    alive,
    assert_nothing_lost,
    finish_run,
    killed_on_error,
    launch_tiny,
    steps_done,
    wait_until,
)

from streamrl.cli import main as cli

pytestmark = pytest.mark.slow


def _launch(run_dir: Path, steps: int) -> subprocess.Popen:
    return launch_tiny(run_dir, f"run.max_steps={steps}", "run.heartbeat_timeout_s=30")


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

    with killed_on_error(proc):
        wait_until(lambda: proc.poll() is not None or steps_done(run_dir) >= 2, 240, "step 2")
        admin("pause")
        admin("set", "generator.count=3")
        wait_until(lambda: "generator 2" in generator_pids(), 120, "generator 2 started")
        third, second = generator_pids()["generator 2"], generator_pids()["generator 1"]
        admin("resume")
        at = steps_done(run_dir)
        wait_until(lambda: steps_done(run_dir) >= at + 3, 240, "three steps with 3 generators")
        admin("pause")
        admin("set", "generator.count=1")
        wait_until(lambda: not alive(third) and not alive(second), 120, "generators 1, 2 retired")
        admin("resume")
    out, summary = finish_run(proc, run_dir)
    assert summary["version"] == 40
    assert "generator 2: started" in out and "generator 2: retired" in out
    assert "generator 1: retired" in out
    assert summary["restarts"] == {}
    assert_nothing_lost(summary, run_dir)
