"""``streamrl bench throughput``: synchronous against asynchronous mode, steady state only.

The same config runs in sync mode twice and async at each ``max_staleness`` (η), each through
``streamrl launch`` in its own process. Two synchronous baselines:

- **split** (``sync``): the async placement. On CPU, learner ranks and generators are pinned
  to disjoint cores (``placement.pin_cpus``), the way separate GPU pools are; on GPU, each
  role has its own device. Each phase idles the other's resources.
- **colocated** (``sync-colocated``, CPU only): nothing pinned, so each phase runs on every
  core while the other waits (``streamrl.cores``), as a colocated synchronous trainer does
  (verl's hybrid engine, TRL). The stronger baseline, and the headline.

Async runs on the split placement. Held-out evaluation is off.

Every figure comes from the run's ``metrics.jsonl`` over a window that skips ``warmup``
steps (process start, model load and, in async mode, the η batches generated before the
first step) and spans the ``steps`` after it:

- trained samples/s and tokens/s: what the learner consumed in the window;
- generated tokens/s: what the generators produced (kept or dropped);
- busy fractions from timers inside the roles (``GeneratorActivity`` in each generator
  report, the learner's ``time/busy_s``), and the generators' time waiting for admission,
  waiting for a weight version, and paused applying weights;
- the staleness histogram and weight bytes published per step.

From the split sync run, T_gen and T_train per step (each role's busy seconds per step: in sync
mode each runs alone) give the ideal speedup ``(T_gen + T_train) / max(T_gen, T_train)``;
efficiency = measured async/sync ÷ ideal. Against the colocated baseline the ideal is
``(T_gen' + T_train') / max(T_gen, T_train)``, with T' the colocated run's (each phase on every
core) and the denominator async's best step on the split placement.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from streamrl.clock import live_records
from streamrl.config import Config, load_config
from streamrl.protocol import WEIGHT_STAGES


class BenchError(RuntimeError):
    """A benchmark that cannot run or measures nothing; the message is one line."""


COLOCATED = "sync-colocated"  # the colocated synchronous baseline's mode and run name


def mode_overrides(mode: str, eta: int, steps: int, warmup: int, out: Path) -> list[str]:
    """What every benchmarked run shares, beside the user's overrides. ``mode``: sync,
    sync-colocated or async."""
    name = mode if mode != "async" else f"async-eta{eta}"
    return [
        f"run.output_dir={out / 'runs'}",
        f"run.name={name}",
        "run.overwrite=true",
        f"run.mode={'sync' if mode == COLOCATED else mode}",
        f"run.max_steps={warmup + steps}",
        f"buffer.max_staleness={eta}",
        "eval.every=0",
        # Every arm runs its steps: no early stop (a job's own rules would cut the window).
        "eval.patience=0",
        "eval.stop_below_best=0",
        "run.stop_when_starved_s=0",
        "logging.progress=false",
        f"placement.pin_cpus={'false' if mode == COLOCATED else 'true'}",
    ]


def run_mode(
    config_path: str | None,
    overrides: list[str],
    mode: str,
    eta: int,
    steps: int,
    warmup: int,
    out: Path,
) -> dict[str, Any]:
    """One benchmarked run (``streamrl launch`` in a child process; its console goes to
    ``<out>/<name>.log``), measured by ``measure``."""
    args = [*mode_overrides(mode, eta, steps, warmup, out), *overrides]
    config = load_config(config_path, args)
    name = config.run.name
    command = [sys.executable, "-m", "streamrl.cli", "launch"]
    command += [config_path] if config_path else []
    with open(out / f"{name}.log", "w") as log:
        if subprocess.run([*command, *args], stdout=log, stderr=log).returncode != 0:
            raise BenchError(f"the {name} run failed: see {log.name}")
    lines = (out / "runs" / name / "metrics.jsonl").read_text().splitlines()
    result = measure(live_records([json.loads(line) for line in lines]), warmup, config)
    result.update(mode=mode, eta=eta if mode == "async" else 0, name=name)
    return result


def measure(records: list[dict[str, Any]], warmup: int, config: Config) -> dict[str, Any]:
    """The window's figures from a run's step records (module doc). The window opens at the
    record of step ``warmup`` and closes at the last step."""
    steps = [r for r in records if "step" in r]
    if len(steps) < warmup + 2:
        raise BenchError(f"{len(steps)} steps logged: need the warm-up ({warmup}) and 2 more")
    opening = steps[warmup - 1] if warmup > 0 else steps[0]
    window = [r for r in steps if r["step"] > opening["step"]]
    last = window[-1]
    span = last["time"] - opening["time"]
    n_gen = max(int(last.get("generators/count", config.generator.count)), 1)

    def delta(key: str) -> float:
        return float(last.get(key, 0.0)) - float(opening.get(key, 0.0))

    def per_generator(key: str) -> float:
        return delta(key) / (span * n_gen)

    samples_per_step = config.learner.groups_per_step * config.generator.group_size
    histogram: dict[str, float] = {}
    for r in window:
        for key, value in r.items():
            if key.startswith("staleness/groups_at_"):
                bucket = key.removeprefix("staleness/groups_at_")
                histogram[bucket] = histogram.get(bucket, 0.0) + value
    learner_busy = sum(r.get("time/busy_s", 0.0) for r in window)
    latencies = [
        r["weights/publish_to_applied_s_max"]
        for r in window
        if r.get("weights/publish_to_applied_s_max", 0.0) > 0
    ]
    return {
        "steps": len(window),
        "window_s": span,
        "samples_per_s": len(window) * samples_per_step / span,
        "trained_tokens_per_s": sum(r["train/response_tokens"] for r in window) / span,
        # The spread of trajectory lengths (episodes: a synchronous step waits for its
        # longest): the mean length, the mean of each step's longest, and turns per episode.
        "response_tokens_mean": sum(r["train/response_tokens"] for r in window)
        / (len(window) * samples_per_step),
        "response_tokens_max_mean": sum(r.get("train/response_tokens_max", 0.0) for r in window)
        / len(window),
        "turns_mean": sum(r.get("train/turns_mean", 0.0) for r in window) / len(window),
        "generated_tokens_per_s": delta("generators/tokens_total") / span,
        # The share of the window's generated tokens that ended in a gradient
        # (controller.generation_yield).
        "useful_generation": delta("generation/trained_tokens_total")
        / max(delta("generation/tokens_total"), 1.0),
        "generator_busy": per_generator("generators/busy_s_total"),
        "generator_wait_admission": per_generator("generators/wait_admission_s_total"),
        "generator_wait_weights": per_generator("generators/wait_weights_s_total"),
        "generator_weights_pause": per_generator("generators/weights_pause_s_total"),
        # Publish -> adopted by every generator (each step record's worst), over the window.
        "publish_to_applied_median_s": _median(latencies),
        "publish_to_applied_max_s": max(latencies, default=0.0),
        "weight_stages": weight_stages(window),
        "learner_busy": learner_busy / span,
        "t_gen_per_step_s": delta("generators/busy_s_total") / n_gen / len(window),
        "t_train_per_step_s": learner_busy / len(window),
        "groups_generated": delta("generators/groups_total"),
        "groups_dropped": delta("buffer/dropped"),
        "calls_per_step": delta("generators/calls_total") / len(window),
        "rows_per_call": delta("generators/groups_total")
        * config.generator.group_size
        / max(delta("generators/calls_total"), 1.0),
        "staleness_mean": sum(r["staleness/mean"] for r in window) / len(window),
        # The buffer's level when the window opens and over it: steady if they agree.
        "buffer_at_open": float(opening.get("buffer/size", 0)),
        "buffer_mean": sum(r.get("buffer/size", 0) for r in window) / len(window),
        "staleness_histogram": histogram,
        "weight_bytes_per_step": sum(r.get("weights/bytes_sent", 0.0) for r in window)
        / len(window),
        "weights_changed_frac_max": max(r.get("weights/changed_frac", 0.0) for r in steps),
        "timeline": timeline(steps, n_gen),
        "reward_roles": reward_role_figures(opening, last),
    }


# The learner's stages of a version, from its step metrics (workers.learning.publisher):
# ``out`` is publish -> its last chunk sent (the three before it and the hand-offs between).
LEARNER_STAGES = ("snapshot", "encode", "send", "out")


def weight_stages(window: list[dict[str, Any]]) -> dict[str, list[float]]:
    """stage -> [median, max] seconds over the window: the learner's stages of the last
    version its encoder finished at each step, and the slowest generator's ``WeightStages``
    (``arrive`` spans ``out`` and the wire)."""
    keys = {s: f"weights/{s}_s" for s in LEARNER_STAGES}
    keys |= {s: f"weights/stage_{s}_s_max" for s in WEIGHT_STAGES}
    out = {}
    for stage, key in keys.items():
        values = [float(r[key]) for r in window if key in r]
        if values:
            out[stage] = [_median(values), max(values)]
    return out


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def reward_role_figures(opening: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    """Per reward role (docs/design.md §7c), over the window: its busy fraction (scoring
    seconds over its up seconds) and the mean wait of a request in its queue before its
    batch began; empty without served rewards. A role restarted in the window is measured
    from its restart (its totals start again)."""
    out = {}
    for key in last:
        if not (key.startswith("scoring/") and key.endswith("/busy_s_total")):
            continue
        prefix = key.removesuffix("/busy_s_total")
        label = prefix.removeprefix("scoring/")

        def delta(name: str, prefix: str = prefix) -> float:
            now, then = last.get(f"{prefix}/{name}", 0.0), opening.get(f"{prefix}/{name}", 0.0)
            return now - then if now >= then else now  # restarted: its own totals

        requests = delta("requests_total")
        up = delta("up_s_total")
        out[label] = {
            "busy_fraction": delta("busy_s_total") / up if up > 0 else 0.0,
            "queue_wait_mean_s": delta("queue_wait_s_total") / requests if requests else 0.0,
            "latency_p95_s": float(last.get(f"{prefix}/latency_p95_s", 0.0)),
            "requests": requests,
        }
    return out


def timeline(steps: list[dict[str, Any]], n_gen: int) -> list[dict[str, float]]:
    """Per step: seconds since the first step, generator and learner busy fractions over the
    interval since the previous step, and the batch's mean reward (for the report's plots)."""
    points = []
    for prev, cur in zip(steps, steps[1:], strict=False):
        dt = max(cur["time"] - prev["time"], 1e-9)
        gen = cur.get("generators/busy_s_total", 0.0) - prev.get("generators/busy_s_total", 0.0)
        points.append(
            {
                "t": cur["time"] - steps[0]["time"],
                "generator_busy": min(gen / (dt * n_gen), 1.0),
                "learner_busy": min(cur.get("time/busy_s", 0.0) / dt, 1.0),
                "reward": cur.get("reward/mean", 0.0),
            }
        )
    return points


def check_weights_move(result: dict[str, Any]) -> None:
    """A workload whose weights never change measures nothing of the weight path."""
    if result["weights_changed_frac_max"] <= 0.0:
        raise BenchError(
            f"the {result['name']} run never changed its weights (weights/changed_frac 0 at "
            "every step): it measures nothing of the weight path; use a config whose reward "
            "the model can learn (configs/default.yaml, configs/tiny.yaml)"
        )


def compare(results: list[dict[str, Any]]) -> dict[str, Any]:
    """async/sync per η against the ideal from the split sync run's T_gen and T_train, and,
    when it ran, against the colocated sync run (module doc)."""
    sync = next(r for r in results if r["mode"] == "sync")
    t_gen, t_train = sync["t_gen_per_step_s"], sync["t_train_per_step_s"]
    slowest = max(t_gen, t_train, 1e-9)
    ideal = (t_gen + t_train) / slowest
    colocated = next((r for r in results if r["mode"] == COLOCATED), None)
    ideal_colocated = None
    if colocated is not None:
        step = colocated["t_gen_per_step_s"] + colocated["t_train_per_step_s"]
        ideal_colocated = step / slowest
    rows = []
    for r in results:
        if r["mode"] != "async":
            continue
        ratio = r["samples_per_s"] / sync["samples_per_s"]
        row = {
            "eta": r["eta"],
            "async_over_sync": ratio,
            "efficiency": ratio / ideal,
            "generator_busy": r["generator_busy"],
            # The role that sets the pace (the busier one): the target is on it.
            "pacing_role": "learner" if r["learner_busy"] > r["generator_busy"] else "generators",
            "pacing_busy": max(r["learner_busy"], r["generator_busy"]),
        }
        if colocated is not None and ideal_colocated is not None:
            row["async_over_colocated"] = r["samples_per_s"] / colocated["samples_per_s"]
            row["efficiency_colocated"] = row["async_over_colocated"] / ideal_colocated
        rows.append(row)
    out = {"t_gen_s": t_gen, "t_train_s": t_train, "ideal": ideal, "async": rows}
    if colocated is not None:
        out.update(
            t_gen_colocated_s=colocated["t_gen_per_step_s"],
            t_train_colocated_s=colocated["t_train_per_step_s"],
            ideal_colocated=ideal_colocated,
        )
    return out


def placement_text(config: Config) -> str:
    """How roles are placed in the benchmarked runs (printed and put in the report)."""
    import os

    from streamrl.controller.placement import cpu_split, describe_split

    split = cpu_split(config, sorted(os.sched_getaffinity(0)))
    gpu = [
        f"{role}s on {section.device}"
        for role, section in (("learner", config.learner), ("generator", config.generator))
        if section.device != "cpu"
    ]
    return "; ".join(filter(None, [describe_split(split), *gpu])) or "unpinned"


def bench_throughput(
    config_path: str | None,
    overrides: list[str],
    *,
    steps: int,
    warmup: int,
    etas: list[int],
    out: Path,
    console=sys.stdout,
) -> dict[str, Any]:
    """Run sync, then async at each η; write results.json, report.md and PNGs to ``out``."""
    from streamrl.bench.report import machine, markdown, plots

    if steps < 2 or warmup < 1:
        raise BenchError("need --steps >= 2 and --warmup >= 1 (the window opens after warm-up)")
    if not etas or min(etas) < 0:
        raise BenchError("--staleness needs one or more values >= 0")
    config = load_config(
        config_path, [*mode_overrides("async", max(etas), steps, warmup, out), *overrides]
    )
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "config": config_path or "built-in defaults",
        "overrides": overrides,
        "steps": steps,
        "warmup": warmup,
        "machine": machine(),
        "placement": placement_text(config),
    }
    print(
        f"bench throughput: {meta['config']}; {meta['machine']['cpu']}, "
        f"{meta['machine']['cores']} cores; placement: {meta['placement']}",
        file=console,
        flush=True,
    )
    results = []
    # The colocated baseline is a CPU one: on GPUs each role keeps its own device.
    on_cpu = config.learner.device == "cpu" and config.generator.device == "cpu"
    baselines = [("sync", 0), *([(COLOCATED, 0)] if on_cpu else [])]
    for mode, eta in [*baselines, *(("async", e) for e in etas)]:
        result = run_mode(config_path, overrides, mode, eta, steps, warmup, out)
        if mode == "sync":
            check_weights_move(result)
        results.append(result)
        print(
            f"{result['name']:<12} {result['samples_per_s']:.2f} samples/s, "
            f"{result['generated_tokens_per_s']:.1f} generated tok/s "
            f"({100 * result['useful_generation']:.0f}% useful), generator busy "
            f"{100 * result['generator_busy']:.0f}%, learner busy "
            f"{100 * result['learner_busy']:.0f}%, weight pauses "
            f"{100 * result['generator_weights_pause']:.1f}%, publish->applied "
            f"{result['publish_to_applied_median_s']:.2f}/{result['publish_to_applied_max_s']:.2f}"
            f" s (median/max), staleness {result['staleness_mean']:.2f} "
            f"({result['window_s']:.0f} s window); trajectory length mean "
            f"{result['response_tokens_mean']:.1f}, longest per step "
            f"{result['response_tokens_max_mean']:.1f} tokens"
            + (f", {result['turns_mean']:.2f} turns" if result["turns_mean"] else ""),
            file=console,
            flush=True,
        )
        if result["weight_stages"]:
            print(
                f"{'':<12} weight path by stage, median/max s: "
                + ", ".join(
                    f"{stage} {med:.3f}/{top:.3f}"
                    for stage, (med, top) in result["weight_stages"].items()
                ),
                file=console,
                flush=True,
            )
        for label, role in result["reward_roles"].items():
            print(
                f"{'':<12} reward role {label}: busy {100 * role['busy_fraction']:.0f}%, "
                f"queue wait {1000 * role['queue_wait_mean_s']:.0f} ms mean, latency p95 "
                f"{1000 * role['latency_p95_s']:.0f} ms, {role['requests']:.0f} requests",
                file=console,
                flush=True,
            )
    comparison = compare(results)
    shape = {
        "generators": config.generator.count,
        "learner_ranks": config.learner.count,
        "groups_per_step": config.learner.groups_per_step,
        "group_size": config.generator.group_size,
        "prompts_per_call": config.generator.prompts_per_call,
        "generator_device": config.generator.device,
    }
    report = {"meta": meta, "shape": shape, "results": results, "comparison": comparison}
    (out / "results.json").write_text(json.dumps(report, indent=1))
    (out / "report.md").write_text(markdown(results, comparison, meta))
    try:
        plots(results, out)
    except ImportError:  # matplotlib is a dev extra: the figures are in report.md either way
        print("matplotlib is not installed: no PNGs", file=console)
    print(
        f"ideal async/sync (split) {comparison['ideal']:.2f}x (T_gen "
        f"{comparison['t_gen_s']:.2f} s, T_train {comparison['t_train_s']:.2f} s per step)",
        file=console,
    )
    if "ideal_colocated" in comparison:
        print(
            f"ideal async/sync (colocated) {comparison['ideal_colocated']:.2f}x (T_gen "
            f"{comparison['t_gen_colocated_s']:.2f} s, T_train "
            f"{comparison['t_train_colocated_s']:.2f} s per step on every core)",
            file=console,
        )
    for row in comparison["async"]:
        against_colocated = (
            f"; {row['async_over_colocated']:.2f}x colocated sync, efficiency "
            f"{row['efficiency_colocated']:.2f}"
            if "async_over_colocated" in row
            else ""
        )
        print(
            f"async η={row['eta']}: {row['async_over_sync']:.2f}x split sync, efficiency "
            f"{row['efficiency']:.2f} of ideal (target 0.9){against_colocated}; the pacing "
            f"role ({row['pacing_role']}) busy {100 * row['pacing_busy']:.0f}% (target 90%)",
            file=console,
        )
    print(f"wrote {out / 'report.md'}, results.json and PNGs", file=console, flush=True)
    return report
