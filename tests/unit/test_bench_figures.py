"""`streamrl bench`: the window's figures, the ideal ratio, the refusal of a workload that
measures nothing, the simulation's rules, and CPU pinning's core split."""

from __future__ import annotations

import pytest

from streamrl.bench.simulate import Lengths, Simulation, Workload, predict, workload_from_bench
from streamrl.bench.throughput import BenchError, check_weights_move, compare, measure
from streamrl.config import load_config
from streamrl.controller.placement import cpu_split
from streamrl.controller.rundir import RunError


def _records(n: int, step_s: float, gen_busy_per_step: float, train_s: float) -> list[dict]:
    """A synthetic metrics.jsonl: one generator, steps every ``step_s`` seconds."""
    return [
        {
            "step": i,
            "time": 100.0 + i * step_s,
            "train/response_tokens": 40.0,
            "time/busy_s": train_s,
            "staleness/mean": 1.0,
            "staleness/groups_at_1": 4.0,
            "weights/bytes_sent": 1000.0,
            "weights/changed_frac": 0.5,
            "reward/mean": 0.1 * i,
            "generators/count": 1,
            "generators/tokens_total": 50 * i,
            "generators/groups_total": 4 * i,
            "generators/calls_total": 2 * i,
            "generators/busy_s_total": gen_busy_per_step * i,
            "generators/wait_admission_s_total": 0.0,
            "generators/wait_weights_s_total": 0.0,
            "generators/weights_pause_s_total": 0.0,
            "buffer/dropped": 0,
        }
        for i in range(1, n + 1)
    ]


def test_measure_uses_the_window_after_warmup() -> None:
    config = load_config(None, ["learner.groups_per_step=4", "generator.group_size=2"])
    records = [
        {"event": "eval", "time": 0.0},
        *_records(8, step_s=2.0, gen_busy_per_step=1.5, train_s=1.0),
    ]
    result = measure(records, warmup=3, config=config)
    assert result["steps"] == 5  # steps 4..8; the window opens at step 3's record
    assert result["window_s"] == pytest.approx(10.0)
    assert result["samples_per_s"] == pytest.approx(5 * 8 / 10.0)
    assert result["generated_tokens_per_s"] == pytest.approx(5 * 50 / 10.0)
    assert result["generator_busy"] == pytest.approx(0.75)
    assert result["learner_busy"] == pytest.approx(0.5)
    assert result["t_gen_per_step_s"] == pytest.approx(1.5)
    assert result["calls_per_step"] == pytest.approx(2.0)
    assert result["rows_per_call"] == pytest.approx(2 * 2)  # 2 groups x group_size 2
    assert result["staleness_histogram"] == {"1": 20.0}
    with pytest.raises(BenchError, match="need the warm-up"):
        measure(records[:4], warmup=3, config=config)


def test_the_weight_path_is_reported_stage_by_stage() -> None:
    """``bench throughput`` splits publish -> applied into the learner's and the generator's
    stages (median and max over the window) and prints them as a table in report.md."""
    from streamrl.bench.report import stage_table

    config = load_config(None, ["learner.groups_per_step=4", "generator.group_size=2"])
    records = _records(6, step_s=2.0, gen_busy_per_step=1.5, train_s=1.0)
    for i, r in enumerate(records):
        r |= {"weights/snapshot_s": 0.1, "weights/encode_s": 0.2 + 0.01 * i}
        r |= {"weights/out_s": 0.35, "weights/stage_arrive_s_max": 0.4}
        r |= {"weights/stage_prepare_s_max": 0.05 * i, "weights/stage_adopt_s_max": 0.01}
    result = measure(records, warmup=2, config=config)
    stages = result["weight_stages"]
    # Only those measured, the learner's (to its last chunk out) before the generator's.
    assert list(stages) == ["snapshot", "encode", "out", "arrive", "prepare", "adopt"]
    assert stages["encode"] == pytest.approx([0.235, 0.25])  # steps 3-6: i = 2..5
    assert stages["prepare"] == pytest.approx([0.175, 0.25])
    table = "\n".join(stage_table([{**result, "mode": "async", "eta": 1}]))
    header = "| mode | snapshot | encode | out | arrive | prepare | adopt | publish->applied |"
    assert header in table
    assert "| async η=1 | 0.100 / 0.100 | 0.235 / 0.250 |" in table


def test_ideal_ratio_and_efficiency() -> None:
    sync = {
        "mode": "sync",
        "eta": 0,
        "samples_per_s": 1.0,
        "t_gen_per_step_s": 3.0,
        "t_train_per_step_s": 1.0,
    }
    fast = {"mode": "async", "eta": 2, "samples_per_s": 1.2, "generator_busy": 0.95,
            "learner_busy": 0.5}  # fmt: skip
    c = compare([sync, fast])
    assert c["ideal"] == pytest.approx(4.0 / 3.0)
    assert c["async"][0]["async_over_sync"] == pytest.approx(1.2)
    assert c["async"][0]["efficiency"] == pytest.approx(0.9)
    assert "ideal_colocated" not in c and "async_over_colocated" not in c["async"][0]
    # The target is on the busier role, the one that sets the pace.
    assert c["async"][0]["pacing_role"] == "generators"
    assert c["async"][0]["pacing_busy"] == pytest.approx(0.95)


def test_the_colocated_baseline_has_its_own_ideal() -> None:
    split = {
        "mode": "sync",
        "eta": 0,
        "samples_per_s": 1.0,
        "t_gen_per_step_s": 3.0,
        "t_train_per_step_s": 1.0,
    }
    # Each phase on every core: 2.0 + 0.6 s a step, against async's best step of 3.0 s.
    colocated = {**split, "mode": "sync-colocated", "samples_per_s": 1.5,
                 "t_gen_per_step_s": 2.0, "t_train_per_step_s": 0.6}  # fmt: skip
    fast = {"mode": "async", "eta": 1, "samples_per_s": 1.2, "generator_busy": 0.6,
            "learner_busy": 0.91}  # fmt: skip
    c = compare([split, colocated, fast])
    assert c["ideal"] == pytest.approx(4.0 / 3.0)
    assert c["ideal_colocated"] == pytest.approx(2.6 / 3.0)
    (row,) = c["async"]
    assert row["async_over_sync"] == pytest.approx(1.2)
    assert row["async_over_colocated"] == pytest.approx(0.8)
    assert row["efficiency_colocated"] == pytest.approx(0.8 / (2.6 / 3.0))
    assert (row["pacing_role"], row["pacing_busy"]) == ("learner", 0.91)


def test_a_workload_whose_weights_never_change_is_refused() -> None:
    with pytest.raises(BenchError, match="never changed its weights"):
        check_weights_move({"name": "sync", "weights_changed_frac_max": 0.0})
    check_weights_move({"name": "sync", "weights_changed_frac_max": 0.01})


def _workload(**changes) -> Workload:
    base = dict(
        generators=2,
        learner_ranks=1,
        groups_per_step=4,
        group_size=4,
        prompts_per_call=2,
        decode_step_s=0.1,
        train_s_per_token=0.01,
        lengths=Lengths(fixed=10.0),
    )
    return Workload(**{**base, **changes})


def test_simulation_keeps_the_staleness_bound_and_sync_is_on_policy() -> None:
    for eta in (0, 1, 3):
        sim = Simulation(_workload(), eta, in_flight=eta > 0, steps=20, seed=1)
        sim.run()
        staleness = [s for step in sim.step_staleness for s in step]
        assert len(sim.step_times) == 20
        assert max(staleness) <= eta
    sync = Simulation(_workload(), 0, in_flight=False, steps=10)
    sync.run()
    assert {s for step in sync.step_staleness for s in step} == {0}


def test_simulation_async_overlaps_generation_and_training() -> None:
    # Per step: 2 calls, one per generator in parallel, 10 decode steps x 0.1 s = T_gen 1 s;
    # training 4 groups x 4 x 10 tokens x 0.0125 s = T_train 2 s.
    w = _workload(decode_step_s=0.1, train_s_per_token=0.0125)
    figures = predict(w, [1, 2], steps=30, warmup=5)["modes"]
    assert figures["sync"]["seconds_per_step"] == pytest.approx(3.0, rel=0.02)
    assert figures["async-eta2"]["seconds_per_step"] == pytest.approx(2.0, rel=0.02)
    assert figures["async-eta2"]["async_over_sync"] == pytest.approx(1.5, rel=0.03)
    assert figures["async-eta2"]["learner_busy"] == pytest.approx(1.0, rel=0.02)


def test_dropped_groups_return_their_budget() -> None:
    figures = predict(_workload(drop_rate=0.5), [1], steps=15, warmup=3)["modes"]
    assert figures["sync"]["samples_per_s"] > 0  # no deadlock: the budget came back


def test_workload_calibrated_from_bench_results() -> None:
    results = {
        "meta": {"steps": 10, "warmup": 2},
        "shape": {
            "generators": 1,
            "learner_ranks": 1,
            "groups_per_step": 4,
            "group_size": 8,
            "prompts_per_call": 2,
        },
        "results": [
            {
                "mode": "sync",
                "eta": 0,
                "name": "sync",
                "steps": 10,
                "window_s": 100.0,
                "samples_per_s": 3.2,
                "trained_tokens_per_s": 25.6,
                "t_gen_per_step_s": 6.0,
                "t_train_per_step_s": 4.0,
                "calls_per_step": 2.0,
                "rows_per_call": 16.0,
                "generator_wait_weights": 0.0,
                "groups_generated": 40.0,
                "groups_dropped": 0.0,
                "generator_weights_pause": 0.01,
            }
        ],
    }
    w = workload_from_bench(results)
    assert w.lengths.fixed == pytest.approx(8.0)
    assert w.decode_step_s * 8.0 == pytest.approx(3.0)  # 6 s per step over 2 calls
    assert w.train_s_per_token * 4 * 8 * 8.0 == pytest.approx(4.0)
    predicted = predict(w, [], steps=12, warmup=2)["modes"]["sync"]
    assert predicted["seconds_per_step"] == pytest.approx(10.0, rel=0.05)


def test_cpu_split_pins_pools_to_disjoint_cores() -> None:
    config = load_config(
        None,
        [
            "placement.pin_cpus=true",
            "learner.count=2",
            "learner.groups_per_step=4",
            "generator.count=3",
        ],
    )
    split = cpu_split(config, [0, 1, 2, 3])
    assert split == {"learner": [[0], [1]], "generator": [[2, 3], [2, 3], [2, 3]]}
    one_each = load_config(None, ["placement.pin_cpus=true"])
    assert cpu_split(one_each, [4, 5]) == {"learner": [[4]], "generator": [[5]]}
    assert cpu_split(load_config(None, []), [0, 1]) == {}
    with pytest.raises(RunError, match="at least 2 cores"):
        cpu_split(one_each, [0])
    wide = load_config(None, ["placement.pin_cpus=true", "placement.learner_cores=2"])
    with pytest.raises(RunError, match="leaves no core"):
        cpu_split(wide, [0, 1])


def test_threads_default_to_a_share_of_the_cores() -> None:
    from streamrl.cores import role_threads

    config = load_config(None, ["learner.count=1", "generator.count=3"])
    assert role_threads(config, "learner", None, 8) == 2  # 8 cores over 4 CPU processes
    assert role_threads(config, "generator", [2, 3, 4], 8) == 3  # pinned: its cores
    assert role_threads(config, "generator", None, 2) == 1  # never 0
    # Sync mode: the sides take turns, so each has the cores the larger side shares.
    sync = load_config(None, ["learner.count=1", "generator.count=3", "run.mode=sync"])
    assert role_threads(sync, "learner", None, 8) == 2  # 8 over the 3 generators, rounded down
    one_each = load_config(None, ["learner.count=1", "generator.count=1", "run.mode=sync"])
    assert role_threads(one_each, "learner", None, 2) == 2
    assert role_threads(one_each, "generator", None, 2) == 2
    explicit = load_config(None, ["generator.threads=5"])
    assert role_threads(explicit, "generator", [1], 8) == 5
    with pytest.raises(Exception, match="generator.threads must be >= 0"):
        load_config(None, ["generator.threads=-1"])


def test_a_burst_pool_has_a_thread_per_core_it_may_use() -> None:
    """A side thread's burst pool (streamrl.cores): a thread per given core, each pinned to
    them (at most BURST_THREADS_MAX); none on a single core, where the work stays put."""
    import os
    import threading

    from streamrl.cores import BURST_THREADS_MAX, burst_pool

    assert burst_pool([0], "one") is None
    own = sorted(os.sched_getaffinity(0))
    pool = burst_pool(own, "burst")
    if len(own) < 2:
        assert pool is None
        return
    try:
        assert pool._max_workers == min(len(own), BURST_THREADS_MAX)
        where = pool.submit(lambda: (threading.current_thread().name, os.sched_getaffinity(0)))
        name, cores = where.result(timeout=10)
        assert name.startswith("burst") and cores == set(own)
    finally:
        pool.shutdown()
