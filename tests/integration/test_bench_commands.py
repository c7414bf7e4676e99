"""`streamrl bench throughput` and `streamrl bench simulate` end to end at a toy size: the
tiny config in sync and async mode on pinned cores, then the simulation calibrated from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import ONE_OF_EACH

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamrl.cli", *args], capture_output=True, text=True, cwd=ROOT
    )


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    result = _cli(
        "bench", "throughput", "configs/tiny.yaml", "--steps", "3", "--warmup", "1",
        "--staleness", "1", "--out", str(out), *ONE_OF_EACH,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "async η=1:" in result.stdout and "efficiency" in result.stdout
    return out


def test_bench_throughput_measures_both_modes_on_pinned_cores(bench_dir: Path) -> None:
    report = json.loads((bench_dir / "results.json").read_text())
    modes = {r["name"]: r for r in report["results"]}
    assert set(modes) == {"sync", "sync-colocated", "async-eta1"}
    for r in modes.values():
        assert r["steps"] == 3 and r["samples_per_s"] > 0 and r["generated_tokens_per_s"] > 0
        assert 0 < r["generator_busy"] <= 1.5 and 0 < r["learner_busy"] <= 1.0
        assert r["weight_bytes_per_step"] > 0  # the tiny reward is learnable: weights move
        assert sum(r["staleness_histogram"].values()) == 3 * 4  # every consumed group
    assert set(modes["sync"]["staleness_histogram"]) == {"0"}
    # The run's own generation rate is never 0 in sync mode, where every step generates (an
    # async generator may rightly sit out a step at its staleness budget).
    lines = (bench_dir / "runs" / "sync" / "metrics.jsonl").read_text().splitlines()
    steps = [r for r in map(json.loads, lines) if "step" in r]
    assert all(r["throughput/tokens_per_s"] > 0 for r in steps)
    assert max(int(k) for k in modes["async-eta1"]["staleness_histogram"]) <= 1
    if len(os.sched_getaffinity(0)) >= 2:
        assert "generator 0: cores" in report["meta"]["placement"]
        log = (bench_dir / "runs" / "sync" / "logs" / "generator-0.log").read_text()
        assert "pinned to cores" in log
    assert report["comparison"]["ideal"] >= 1.0
    # The colocated baseline: nothing pinned, so each phase has every core.
    colocated_log = bench_dir / "runs" / "sync-colocated" / "logs" / "generator-0.log"
    assert "pinned to cores" not in colocated_log.read_text()
    assert "async_over_colocated" in report["comparison"]["async"][0]
    assert "| sync (colocated) |" in (bench_dir / "report.md").read_text()
    for name in ("report.md", "throughput.png", "utilisation.png", "reward.png"):
        assert (bench_dir / name).stat().st_size > 0
    assert "| async η=1 |" in (bench_dir / "report.md").read_text()


def test_bench_simulate_validates_against_the_measurement(bench_dir: Path) -> None:
    result = _cli(
        "bench", "simulate", "--from", str(bench_dir / "results.json"), "--gpus", "8",
        "--staleness", "2", "--steps", "5", "--out", str(bench_dir),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "SIMULATION" in result.stdout
    assert "predicted" in result.stdout and "measured" in result.stdout
    simulation = json.loads((bench_dir / "simulation.json").read_text())
    rows = {row["mode"]: row for row in simulation["validation"]["rows"]}
    assert set(rows) == {"sync", "async-eta1"} and all(r["predicted"] > 0 for r in rows.values())
    assert set(simulation["projection"]["runs"]) == {"8"}


def test_bench_bad_input_is_one_line() -> None:
    result = _cli("bench", "throughput", "configs/missing.yaml", "--steps", "2")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "not found" in result.stderr
    result = _cli("bench", "simulate", "--from", "/nonexistent/results.json")
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0


def test_bench_quality_runs_arms_over_seeds_and_resumes(tmp_path: Path) -> None:
    """Two arms, one seed each, on the tiny job: every (arm, seed) leaves a result with its
    eval curve, the summary has both arms and the plots exist; a second call keeps them."""
    args = [
        "bench", "quality", "--config", "configs/tiny.yaml", "--out", str(tmp_path),
        "--seeds", "0", "--arms", "sync,async-eta1",
        "run.max_steps=2", "eval.every=1", "eval.max_prompts=4", *ONE_OF_EACH,
    ]  # fmt: skip
    result = _cli(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "results.json").read_text())
    assert set(report["runs"]) == set(report["summary"]["arms"]) == {"sync", "async-eta1"}
    for arm in ("sync", "async-eta1"):
        run = report["runs"][arm]["0"]
        assert run["steps"] == 2 and len(run["curve"]) >= 2, run
    for plot in ("quality_by_samples.png", "quality_by_time.png"):
        assert (tmp_path / plot).stat().st_size > 0
    again = _cli(*args)
    assert again.returncode == 0 and again.stdout.count("finished earlier, kept") == 2
