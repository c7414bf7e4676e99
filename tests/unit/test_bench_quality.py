"""`streamrl bench quality` without real runs: time to target, step-wise reading at equal
samples and equal time, the median and range over seeds, each arm's overrides, resuming a
bench that stopped half way, the plots, and one-line refusals of input it cannot run."""

from __future__ import annotations

import io
import json
from pathlib import Path

import msgspec
import pytest

from streamrl.bench import quality, quality_runs
from streamrl.bench.quality_figures import plots
from streamrl.bench.quality_runs import (
    QualityError,
    arm_overrides,
    check_config,
    from_metrics,
    load_result,
    stored,
)
from streamrl.bench.quality_stats import (
    aggregate,
    projected_ceiling,
    table,
    time_to_target,
    value_at,
)
from streamrl.config import Config, load_config

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "tiny.yaml")


def _result(completed: list[float], seconds: list[float], per_eval: float = 64.0) -> dict:
    """A hand-made per-run result: one eval every ``per_eval`` samples from 0."""
    curve = [
        {
            "samples": i * per_eval,
            "seconds": s,
            "exact": min(c + 0.1, 1.0),
            "completed": c,
            "reward_mean": c / 2,
        }
        for i, (c, s) in enumerate(zip(completed, seconds, strict=True))
    ]
    return {
        "wall_s": seconds[-1] + 5.0,
        "steps": len(completed) - 1,
        "curve": curve,
        "train_reward": [[i * per_eval, c] for i, c in enumerate(completed)],
    }


def test_time_to_target_is_the_first_eval_at_or_above_it() -> None:
    curve = _result([0.0, 0.2, 0.35, 0.25, 0.5], [10.0, 20.0, 30.0, 40.0, 50.0])["curve"]
    assert time_to_target(curve, "completed", 0.3) == {"seconds": 30.0, "samples": 128.0}
    assert time_to_target(curve, "completed", 0.35) == {"seconds": 30.0, "samples": 128.0}
    assert time_to_target(curve, "exact", 0.3) == {"seconds": 20.0, "samples": 64.0}
    assert time_to_target(curve, "completed", 0.9) is None
    # Read in wall-time order whatever order the points came in.
    assert time_to_target(curve[::-1], "completed", 0.3)["seconds"] == 30.0


def test_the_projected_ceiling_is_the_saturating_fits_asymptote() -> None:
    """A curve that levels off says where it was heading, before it got there; one still
    climbing in a straight line, or too short to fit, says nothing."""
    seconds = [0.0, 60.0, 120.0, 180.0, 240.0, 300.0]
    # Flat, then a climb that bends towards 0.55 (midpoint at 100 s).
    saturating = [0.05 + 0.5 / (1 + (100.0 / t) ** 2) if t else 0.05 for t in seconds]
    ceiling = projected_ceiling(_result(saturating, seconds)["curve"], "completed")
    # A grid fit (t_mid on a log grid): near, not exact.
    assert ceiling == pytest.approx(0.55, abs=0.02) and ceiling > saturating[-1] + 0.02
    straight = [0.001 * t for t in seconds]
    assert projected_ceiling(_result(straight, seconds)["curve"], "completed") is None
    short = _result([0.1, 0.2, 0.3], [0.0, 60.0, 120.0])["curve"]
    assert projected_ceiling(short, "completed") is None
    rows = aggregate({"a": {0: _result(saturating, seconds)}}, "completed", 0.3)["arms"]
    assert rows["a"]["ceiling"]["median"] == pytest.approx(ceiling)


def test_values_between_evals_are_the_last_eval_before() -> None:
    curve = _result([0.0, 0.2, 0.4], [10.0, 20.0, 30.0])["curve"]
    assert value_at(curve, "seconds", 5.0, "completed") is None  # nothing evaluated yet
    assert value_at(curve, "seconds", 10.0, "completed") == 0.0
    assert value_at(curve, "seconds", 29.9, "completed") == 0.2  # no interpolation
    assert value_at(curve, "seconds", 1e9, "completed") == 0.4  # a finished run keeps its end
    assert value_at(curve, "samples", 100.0, "completed") == 0.2


def test_aggregate_takes_median_and_range_over_seeds() -> None:
    secs = [10.0, 20.0, 30.0, 40.0]
    fast = [5.0, 10.0, 15.0, 20.0]  # async: the same samples in half the time
    results = {
        "sync": {
            0: _result([0.0, 0.1, 0.3, 0.5], secs),
            1: _result([0.0, 0.2, 0.4, 0.6], secs),
            2: _result([0.0, 0.1, 0.2, 0.4], secs),
        },
        "async-eta1": {
            0: _result([0.0, 0.3, 0.3, 0.3], fast),
            1: _result([0.0, 0.1, 0.1, 0.2], fast),
            2: {"failed": "async-eta1 seed 2 failed: see launch.log"},
        },
        "async-eta2": {0: None, 1: None, 2: None},
    }
    for result in results["sync"].values():
        result["setup_s"] = 20.0
    summary = aggregate(results, "completed", 0.3)
    assert summary["equal_samples"] == 192.0
    assert summary["equal_time"] == 20.0  # the fastest run's last eval
    sync, eta1 = summary["arms"]["sync"], summary["arms"]["async-eta1"]
    assert sync["final"]["completed"] == {"median": 0.5, "min": 0.4, "max": 0.6}
    assert sync["final"]["exact"]["median"] == pytest.approx(0.6)
    ttt = sync["time_to_target"]
    assert ttt["reached"] == 3
    assert ttt["seconds"] == {"median": 30.0, "min": 30.0, "max": 40.0}
    assert ttt["samples"] == {"median": 128.0, "min": 128.0, "max": 192.0}
    # Equal time: at 20 s sync has shown 0.1, 0.2, 0.1; async has finished (0.3, 0.2).
    assert sync["at_time"]["completed"] == {"median": 0.1, "min": 0.1, "max": 0.2}
    assert eta1["at_time"]["completed"]["median"] == pytest.approx(0.25)
    # One of two async seeds reached 0.3: the median of (5 s, never) is "never".
    assert eta1["time_to_target"]["reached"] == 1
    assert eta1["time_to_target"]["seconds"] == {"median": None, "min": 10.0, "max": None}
    assert eta1["finished"] == 2 and eta1["failed"] == {2: results["async-eta1"][2]["failed"]}
    assert summary["arms"]["async-eta2"] == {
        "seeds": 3,
        "finished": 0,
        "failed": {},
        "pending": [0, 1, 2],
    }
    # The equal-time band steps exactly at the evals, and a finished run keeps its end.
    assert [p["seconds"] for p in sync["by_time"]] == secs
    assert [(p["seconds"], p["median"]) for p in eta1["by_time"]][-2:] == [
        (20.0, 0.25),
        (40.0, 0.25),
    ]
    band = {p["samples"]: p for p in sync["by_samples"]}
    assert band[64.0] == {"samples": 64.0, "median": 0.1, "min": 0.1, "max": 0.2}
    assert sync["train_reward"][-1] == {"samples": 192.0, "median": 0.5, "min": 0.4, "max": 0.6}
    assert json.loads(json.dumps(summary))  # no infinities in results.json

    text = table(summary, "completed", 0.3)
    assert "50.0% [40.0-60.0]" in text and "30 s [30-40] (3/3)" in text
    assert "not reached (1/2)" in text and "(no finished run)" in text
    assert "45 (+20)" in text  # wall time on the training clock, setup beside it
    assert "failed: async-eta1 seed 2" in text


def test_each_arm_is_what_its_name_says() -> None:
    out = Path("/tmp/bq")

    def config(arm: str, user: list[str] | None = None):
        return load_config(TINY, arm_overrides(arm, 7, out, user or []))

    assert config("sync").run.mode == "sync" and config("sync").buffer.max_staleness == 0
    for eta in (1, 2, 4):
        c = config(f"async-eta{eta}")
        assert (c.run.mode, c.buffer.max_staleness) == ("async", eta)
        assert c.algorithm.correction == "token-tis"  # the config's default correction
    nocorr = config("async-eta1-nocorr")
    assert nocorr.algorithm.correction == "none" and nocorr.algorithm.allow_uncorrected
    assert config("async-eta1-probe").generator.probe_candidates == 3
    screen = config(
        "async-eta1-screen", ["generator.group_size=8", "buffer.drop_zero_variance=true"]
    )
    assert screen.generator.screen_samples == 4
    assert config("async-eta1-noscreen").generator.screen_samples == 0
    nodrop = config("async-eta1-nodrop", ["buffer.drop_zero_variance=true"])
    assert nodrop.buffer.drop_zero_variance is False  # the arm's keys win over the user's
    c = config("async-eta2", ["buffer.max_staleness=3", "run.max_steps=4"])
    assert c.buffer.max_staleness == 2 and c.run.max_steps == 4 and c.run.seed == 7
    assert (c.run.output_dir, c.run.name, c.run.overwrite) == (
        "/tmp/bq/async-eta2/seed-7",
        "run",
        True,
    )
    with pytest.raises(QualityError, match="unknown arm 'async-eta3'"):
        arm_overrides("async-eta3", 0, out, [])
    with pytest.raises(QualityError, match="eval.every = 0"):
        check_config(TINY, "sync", [], out)
    check_config(TINY, "trl", ["eval.every=2"], out)


def test_the_distillation_arms_name_their_teacher() -> None:
    """``distill``: the teacher alone; ``rl-distill``: the teacher beside the config's
    rewards; either refuses to run without ``--teacher``."""
    out = Path("/tmp/bq")
    rules = [r.display_name() for r in load_config(TINY).rewards]
    alone = load_config(TINY, arm_overrides("distill", 0, out, [], teacher="runs/t"))
    assert [
        (r.kind, r.served_model, r.teacher.top_k, r.teacher.target_tau) for r in alone.rewards
    ] == [
        ("teacher", "runs/t", 8, 0.5)  # configs/distill.yaml's recipe
    ]

    # Its eight questions of two samples a step and two versions of lag too: the arm repeats
    # the shipped job's recipe on any config, so the two are held together here.
    def recipe(config: Config) -> tuple[int, int, int, int]:
        g = config.generator
        return (
            g.group_size,
            g.prompts_per_call,
            config.learner.groups_per_step,
            config.buffer.max_staleness,
        )

    assert recipe(alone) == (2, 8, 8, 2)
    shipped = load_config("distill")
    teacher = msgspec.structs.replace(
        alone.rewards[0].teacher, model=shipped.rewards[0].teacher.model
    )
    assert (recipe(alone), teacher) == (recipe(shipped), shipped.rewards[0].teacher)
    both = load_config(TINY, arm_overrides("rl-distill", 0, out, [], teacher="runs/t"))
    assert [r.display_name() for r in both.rewards] == [*rules, "teacher-t"]
    with pytest.raises(QualityError, match="--teacher"):
        arm_overrides("distill", 0, out, [])
    lagged = load_config(TINY, arm_overrides("rl-self", 0, out, []))  # no --teacher
    assert [r.display_name() for r in lagged.rewards] == [*rules, "teacher-self"]
    assert lagged.rewards[-1].lagged_teacher


def test_a_run_result_from_metrics_jsonl() -> None:
    records = [
        {"event": "eval", "time": 105.0, "requested": 0, "eval/version": 0.0,
         "eval/exact_match": 0.1, "eval/completed": 0.05, "eval/reward_mean": 0.2,
         "eval/seconds": 2.0},
        {"step": 1, "time": 108.0, "reward/mean": 0.3},
        {"step": 2, "time": 110.0, "reward/mean": 0.4},
        {"event": "eval", "time": 112.0, "requested": 2, "eval/version": 2.0,
         "eval/exact_match": 0.5, "eval/completed": 0.4, "eval/reward_mean": 0.6},
        {"event": "weights", "time": 113.0},
    ]  # fmt: skip
    result = from_metrics(records, samples_per_step=16, started=100.0)
    # The training clock starts with the before-training eval (103 s), as the TRL peer's.
    assert result["curve"] == [
        {"samples": 0.0, "seconds": 2.0, "exact": 0.1, "completed": 0.05, "reward_mean": 0.2},
        {"samples": 32.0, "seconds": 9.0, "exact": 0.5, "completed": 0.4, "reward_mean": 0.6},
    ]
    assert result["train_reward"] == [[16.0, 0.3], [32.0, 0.4]]
    assert (result["setup_s"], result["wall_s"]) == (3.0, 9.0)
    # Without a before-training eval the clock starts with the process.
    assert from_metrics(records[1:], 16, started=100.0)["curve"][0]["seconds"] == 12.0


def test_a_peer_result_must_have_the_shared_shape(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps({k: v for k, v in _result([0.1], [3.0]).items()}))
    assert load_result(good)["steps"] == 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"wall_s": 1.0, "steps": 2, "curve": [{"samples": 0}]}))
    with pytest.raises(QualityError, match="is not a quality result"):
        load_result(bad)


def _meta(arms: list[str], seeds: list[int]) -> dict:
    return {
        "config": TINY,
        "overrides": ["eval.every=2"],
        "arms": arms,
        "seeds": seeds,
        "target": 0.3,
        "metric": "completed",
        "keep_weights": False,
    }


def test_a_rerun_skips_finished_seeds_and_retries_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, int]] = []
    broken = {("async-eta1", 1)}

    def fake_run(config_path, arm, seed, out, user, teacher=""):
        calls.append((arm, seed))
        assert user == ["eval.every=2"] and config_path == TINY
        (out / arm / f"seed-{seed}" / "run" / "checkpoints").mkdir(parents=True, exist_ok=True)
        if (arm, seed) in broken:
            raise QualityError(f"{arm} seed {seed} failed: see launch.log")
        return _result([0.0, 0.2 + 0.1 * seed, 0.4], [10.0, 20.0, 30.0])

    monkeypatch.setattr(quality_runs, "run_streamrl", fake_run)
    meta = _meta(["sync", "async-eta1"], [0, 1])
    console = io.StringIO()
    document = quality.bench(tmp_path, meta, console)
    assert calls == [("sync", 0), ("async-eta1", 0), ("sync", 1), ("async-eta1", 1)]
    assert "async-eta1 seed 1: FAILED" in console.getvalue()
    assert document["summary"]["arms"]["async-eta1"]["finished"] == 1
    assert stored(tmp_path, "async-eta1", 1) == {
        "failed": "async-eta1 seed 1 failed: see launch.log"
    }
    assert stored(tmp_path, "sync", 0)["arm"] == "sync"
    assert not (tmp_path / "sync" / "seed-0" / "run" / "checkpoints").exists()  # pruned
    assert (tmp_path / "async-eta1" / "seed-1" / "run" / "checkpoints").exists()  # kept: failed
    assert not (tmp_path / "bench.pid").exists()

    # A run interrupted before its result was written counts as not run: it starts again.
    (tmp_path / "sync" / "seed-1" / "result.json").unlink()
    calls.clear()
    broken.clear()
    console = io.StringIO()
    document = quality.bench(tmp_path, meta, console)
    assert calls == [("sync", 1), ("async-eta1", 1)]
    assert "sync seed 0: finished earlier, kept" in console.getvalue()
    assert not (tmp_path / "async-eta1" / "seed-1" / "failed.json").exists()
    assert all(row["finished"] == 2 for row in document["summary"]["arms"].values())
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["meta"]["machine"]["cpu_capability"] and saved["runs"]["sync"]["0"]["curve"]
    assert (tmp_path / "quality_by_samples.png").stat().st_size > 0
    assert (tmp_path / "quality_by_time.png").stat().st_size > 0


def test_plots_are_written(tmp_path: Path) -> None:
    results = {
        "sync": {s: _result([0.0, 0.1 * s, 0.5], [10.0, 20.0, 30.0]) for s in range(3)},
        "trl": {0: _result([0.0, 0.2, 0.3], [15.0, 35.0, 55.0], per_eval=80.0)},
    }
    paths = plots(aggregate(results, "exact", 0.3), tmp_path, "exact", 0.3)
    assert [p.name for p in paths] == ["quality_by_samples.png", "quality_by_time.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


def _main(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str]:
    code = quality.main(list(argv))
    return code, capsys.readouterr().err.strip()


def test_bad_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = ["--out", str(tmp_path), "--config", TINY]
    code, err = _main(capsys, *out, "--arms", "sync,async-eta3", "eval.every=2")
    assert code == 2 and "unknown arm 'async-eta3'" in err and "\n" not in err
    code, err = _main(capsys, *out, "--arms", "sync")
    assert code == 2 and "eval.every = 0" in err and "\n" not in err
    code, err = _main(capsys, *out, "--seeds", "0,x", "eval.every=2")
    assert code == 2 and "--seeds" in err
    code, err = _main(capsys, *out, "run.seed=3", "eval.every=2")
    assert code == 2 and "the bench sets it" in err
    code, err = _main(capsys, *out, "eval.every=2", "learner.nope=1")
    assert code == 2 and "\n" not in err
    monkeypatch.setattr(quality, "TRL_PYTHON", tmp_path / "missing" / "python")
    code, err = _main(capsys, *out, "--peer", "trl", "eval.every=2")
    assert code == 2 and "run ./scripts/trl_venv.sh first" in err and "\n" not in err
    assert not (tmp_path / "bench.json").exists()  # nothing was started


def test_report_reuses_the_bench_in_out(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    meta = _meta(["sync"], [0, 1])
    (tmp_path / "bench.json").write_text(json.dumps(meta))
    where = tmp_path / "sync" / "seed-0"
    where.mkdir(parents=True)
    (where / "result.json").write_text(json.dumps({**_result([0.0, 0.4], [5.0, 9.0]), "cpu": "X"}))
    assert quality.main(["--out", str(tmp_path), "--report", "--target", "0.5"]) == 0
    printed = capsys.readouterr().out
    assert "1/2" in printed and "not reached (0/1)" in printed and "runs made on: X" in printed
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["meta"]["target"] == 0.5 and saved["meta"]["seeds"] == [0, 1]
    code, err = _main(capsys, "--out", str(tmp_path), "--config", TINY, "eval.every=4")
    assert code == 2 and "differs from" in err


def test_background_detaches_the_same_bench(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = {}

    class FakePopen:
        pid = 4242

        def __init__(self, command, **kwargs):
            started.update(command=command, **kwargs)

    monkeypatch.setattr(quality.subprocess, "Popen", FakePopen)
    argv = ["--config", TINY, "--out", str(tmp_path), "--background", "eval.every=2"]
    assert quality.main(argv) == 0
    assert started["command"][1:] == ["-m", "streamrl.bench.quality", *argv[:4], "eval.every=2"]
    assert started["start_new_session"] and started["stdout"].name == str(tmp_path / "bench.log")
    assert (tmp_path / "bench.pid").read_text() == "4242"
    assert "pid 4242" in capsys.readouterr().out
    assert json.loads((tmp_path / "bench.json").read_text())["overrides"] == ["eval.every=2"]
