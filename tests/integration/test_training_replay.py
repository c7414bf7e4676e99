"""``streamrl replay`` on a real tiny run (2 FSDP2 ranks, gloo on loopback): the learner alone,
retrained from the training record, matches the run bit for bit at every step; a counterfactual
arm trains the same batches under another config; a damaged record is named, not trusted."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from support import replay_cli

from streamrl.config import load_config
from streamrl.controller.run import Controller
from streamrl.workers.learning.training_record import record_path

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
STEPS = 4


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    config = load_config(
        ROOT / "configs" / "tiny.yaml",
        [f"run.output_dir={out}", "run.name=recorded", f"run.max_steps={STEPS}"],
    )
    summary = Controller(config, console=io.StringIO()).run()
    assert summary["version"] == STEPS
    return Path(summary["run_dir"])


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("replays", "hf", "buffer"))
    return copy


def test_every_step_replays_bitwise(run_dir: Path) -> None:
    result = replay_cli(run_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"steps 1-{STEPS} bitwise equal to the run" in result.stdout
    original = run_dir / "replays" / "original.jsonl"
    rows = [json.loads(x) for x in original.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["replay/bitwise"] == 1.0 for r in rows)
    # The replayed step is the run's step: the same figures as the run reported.
    run_rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    run_loss = {r["step"]: r["loss/total"] for r in run_rows if "loss/total" in r}
    assert {r["step"]: r["loss/total"] for r in rows} == run_loss


def test_a_counterfactual_arm_trains_the_same_batches_another_way(run_dir: Path) -> None:
    result = replay_cli(
        run_dir, "--set", "learner.lr=0.01", "--set", "algorithm.clip_high=0.28", "--eval-at", "0,3"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    arm = run_dir / "replays" / "learner.lr=0.01,algorithm.clip_high=0.28.jsonl"
    rows = [json.loads(x) for x in arm.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(0, STEPS + 1))  # 0: evaluated before step 1
    # Held-out figures of both arms before step 1 and after step 3, at those versions.
    original = [
        json.loads(x) for x in (run_dir / "replays" / "original.jsonl").read_text().splitlines()
    ]
    for arm_rows in (rows, original):
        evaluated = [(r["step"], r["eval/version"]) for r in arm_rows if "eval/completed" in r]
        assert evaluated == [(0, 0.0), (3, 3.0)]
    rows = rows[1:]
    # Step 1 starts from the same weights; from step 2 on the arm has moved away.
    assert rows[0]["replay/logprob_abs_from_original"] == 0.0
    assert all(r["replay/logprob_abs_from_original"] > 0 for r in rows[1:])
    assert rows[-1]["train/lr"] > 0 and "policy/is_ess" in rows[-1]
    table = replay_cli(run_dir, "--compare")
    lines = table.stdout.splitlines()
    assert lines[0].startswith("arm") and "k3_orig" in lines[0] and "held_out" in lines[0]
    assert lines[1].startswith("original") and lines[2].startswith("learner.lr=0.01")


def test_a_step_that_differs_is_named(run_dir: Path, tmp_path: Path) -> None:
    copy = _copy(run_dir, tmp_path)
    path = record_path(copy, 1, 0)
    table = pa.ipc.open_stream(path.read_bytes()).read_all()  # not mapped: rewritten below
    digests = table.column("digest").to_pylist()
    digests[2] ^= 1  # step 3 of rank 1 "made" other weights
    column = table.schema.get_field_index("digest")
    table = table.set_column(column, "digest", pa.array(digests, pa.uint64()))
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    result = replay_cli(copy)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "step 3 differs from the run (steps 1-3 replayed)" in result.stdout


def test_a_truncated_record_replays_what_it_can(run_dir: Path, tmp_path: Path) -> None:
    copy = _copy(run_dir, tmp_path)
    path = record_path(copy, 0, 0)
    path.write_bytes(path.read_bytes()[:-300])
    result = replay_cli(copy)
    assert result.returncode == 0, result.stdout + result.stderr
    problems = [x for x in result.stderr.splitlines() if x.startswith("streamrl replay:")]
    assert problems == [problems[0]] and "rank0.epoch0.arrow: truncated after step 3" in problems[0]
    assert "steps 1-3 bitwise equal to the run" in result.stdout


def test_a_run_without_a_record_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("run: {max_steps: 2}\n")
    result = replay_cli(tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "no training record" in result.stderr


def test_the_replay_benchmark_prints_the_record_s_cost(run_dir: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "replay.py"), str(run_dir), "--until", "2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"record: {STEPS} steps x 2 rank(s)" in result.stdout
    assert "replay: 2 steps in" in result.stdout and "bitwise" in result.stdout
