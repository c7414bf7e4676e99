"""The run's records from its state: step lines, the summary, the closing lines."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from streamrl.checkpoint_layout import checkpoints_root, path_for, write_meta
from streamrl.controller.records import (
    best_evaluation,
    keep_best,
    outcome,
    run_summary,
    step_record,
)
from streamrl.controller.state import RunState
from streamrl.protocol import EvalReport, GeneratorReport, LearnerStep, ShardStats


def make_state() -> RunState:
    state = RunState()
    state.version = 7
    state.generators[0] = GeneratorReport(0, 7, 900, 10, 0, 1, 1.0)
    state.ended.append(GeneratorReport(1, 5, 300, 4, 0, 1, 0.5))  # a replaced incarnation
    state.shards[0] = ShardStats(
        0,
        2,
        64,
        12,
        9,
        {"stale": 1},
        100,
        received_total=13,
        removed_total={"consumed": 10, "stale": 1},
    )
    return state


def summary_of(
    evals: list[EvalReport], run_dir: Path, metric: str, model_version: int | None = None
) -> dict[str, Any]:
    """The summary of a run that evaluated ``evals`` and reads ``metric`` as its best."""
    return run_summary(
        make_state(),
        durable=False,
        rolled_back=0,
        ignored_reports={},
        evals=evals,
        run_dir=run_dir,
        wall_time_s=1.0,
        best_metric=metric,
        model_version=model_version,
    )


def test_summary_accounts_for_every_group_and_ended_generators():
    state = make_state()
    evals = [
        EvalReport(
            0, 0, 0, {"eval/exact_match": 0.1, "eval/accuracy": 0.1, "eval/reward_mean": 0.2}, 0.0
        ),
        EvalReport(
            0, 7, 7, {"eval/exact_match": 0.5, "eval/accuracy": 0.5, "eval/reward_mean": 0.6}, 1.0
        ),
    ]
    summary = run_summary(
        state,
        durable=True,
        rolled_back=2,
        ignored_reports={"LearnerStep: from a replaced learner group": 1},
        evals=evals,
        run_dir=Path("runs/x"),
        wall_time_s=12.0,
    )
    assert summary["groups_lost_in_transit"] == 10 + 4 - 13
    assert summary["buffer"][0]["received_total"] == 13
    assert summary["groups_rolled_back"] == 2 and summary["version"] == 7
    assert (
        run_summary(
            state,
            durable=False,
            rolled_back=0,
            ignored_reports={},
            evals=[],
            run_dir=Path("."),
            wall_time_s=0.0,
        )["groups_lost_in_transit"]
        is None
    )
    lines = outcome(summary).splitlines()
    assert lines[0] == "wall time 12 s, 7 steps"
    assert lines[1] == "eval/exact_match   0.100 (version 0) -> 0.500 (version 7)"


def test_step_record_totals_include_ended_generators():
    record = step_record(make_state(), LearnerStep(7, {"loss/policy": 0.5}, 3.0), 42.0)
    assert record["step"] == 7 and record["loss/policy"] == 0.5
    assert record["generators/tokens_total"] == 1200 and record["generators/count"] == 1
    assert record["buffer/size"] == 2 and record["buffer/dropped"] == 1


def test_the_summary_names_the_best_version_and_its_checkpoint(tmp_path: Path) -> None:
    """A run that ended below its best says which version was best and where its weights are."""
    metric = "eval/exact_match"
    evals = [
        EvalReport(0, v, v, {metric: value}, 0.0)
        for v, value in ((0, 0.05), (10, 0.25), (20, 0.25), (30, 0.1))
    ]
    assert best_evaluation(evals, "eval/completed", tmp_path) is None  # not reported
    best = best_evaluation(evals, metric, tmp_path)
    assert best == {"metric": metric, "value": 0.25, "version": 10, "checkpoint": None}
    checkpoint = path_for(checkpoints_root(tmp_path), 10)
    checkpoint.mkdir(parents=True)
    write_meta(checkpoint, 10)
    summary = summary_of(evals, tmp_path, metric)
    assert summary["best"]["checkpoint"] == str(checkpoint)
    line = f"best {metric} 0.250 at version 10: streamrl export {tmp_path} --step 10 --out DIR"
    assert line in outcome(summary).splitlines()
    summary["eval"] = summary["eval"][:2]  # ended at its best: nothing to point at
    assert not any(s.startswith("best ") for s in outcome(summary).splitlines())


def test_keep_best_leaves_a_run_whose_last_version_is_as_good_as_any(tmp_path: Path) -> None:
    """eval.keep_best moves nothing when the last evaluation ties the best (the earliest of
    equals is the summary's best, but the last weights are as good); and a best version
    without a checkpoint leaves hf/ as it was, said in one line."""
    metric = "eval/exact_match"
    (tmp_path / "hf").mkdir()
    tied = [EvalReport(0, v, v, {metric: x}, 0.0) for v, x in ((0, 0.1), (10, 0.3), (20, 0.3))]
    console = io.StringIO()
    assert keep_best(tied, metric, tmp_path, console) is None
    fell = [*tied, EvalReport(0, 30, 30, {metric: 0.2}, 0.0)]
    (tmp_path / "config.yaml").write_text("model: {name: tiny-random-llama}\n")
    assert keep_best(fell, metric, tmp_path, console) is None  # no checkpoint at v10
    assert "eval.keep_best: hf/ keeps the last version:" in console.getvalue()
    assert "no checkpoint for step 10" in console.getvalue()
    assert len(console.getvalue().splitlines()) == 1
    assert (tmp_path / "hf").is_dir() and not (tmp_path / "hf-last").exists()


def test_the_closing_lines_say_which_version_hf_holds(tmp_path: Path) -> None:
    metric = "eval/exact_match"
    evals = [EvalReport(0, v, v, {metric: x}, 0.0) for v, x in ((0, 0.1), (10, 0.3), (20, 0.2))]
    summary = summary_of(evals, tmp_path, metric, model_version=10)
    assert summary["model_version"] == 10
    lines = outcome(summary).splitlines()
    held = f"hf/ holds version 10, the best {metric} 0.300 (eval.keep_best); the last "
    assert any(line.startswith(held) for line in lines), lines
    assert not any(line.startswith("best ") for line in lines)  # no export to suggest
