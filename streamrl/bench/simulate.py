"""``streamrl bench simulate``: a discrete-event SIMULATION of streamrl's admission, buffer and
staleness rules, to predict throughput and staleness where no cluster is at hand.

The model follows the code it imitates:

- admission is ``staleness.AdmissionPolicy`` itself (the same class): a generator may start a
  group while ``started - dropped < (η + v + 1) * groups_per_step`` and must hold weights of
  the reply's ``min_version`` first;
- a generator call decodes the rows of the groups it was granted (at most
  ``prompts_per_call * group_size``) in lockstep until its longest response ends; a decode
  step of ``r`` rows takes ``decode_step_s * (fixed_rows + r) / (fixed_rows + ref_rows)``
  (``fixed_rows`` = None: the same at any batch, as for a launch-bound GPU engine; 0: per
  row, as for a saturated one); a call also pauses ``weight_sync_s`` per version applied
  (between calls, or in flight);
- each generated group is dropped with probability ``drop_rate`` (dynamic sampling); its
  admission budget returns, as the shards' drop reports make it return;
- the learner takes the oldest ``groups_per_step`` groups with ``min_version >= v - η``
  (older ones are dropped as stale), trains ``response tokens * train_s_per_token /
  learner_ranks`` and publishes version ``v + 1``, which generators can apply
  ``weight_latency_s`` later;
- sync mode is η = 0 without in-flight updates.

Figures are measured like ``bench throughput``'s: over the steps after ``warmup``.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import random
import sys
from collections.abc import Generator as Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from streamrl.config import BufferConfig
from streamrl.controller.staleness import AdmissionPolicy

LABEL = "SIMULATION"


@dataclass(frozen=True)
class Lengths:
    """Response lengths: ``fixed`` tokens each, or log-normal (``median``, ``sigma``) capped
    at ``cap`` (the long tail of reasoning RL)."""

    fixed: float | None = None
    median: float = 1000.0
    sigma: float = 0.8
    cap: int = 8192

    def draw(self, rng: random.Random) -> float:
        if self.fixed is not None:
            return self.fixed
        return min(float(self.cap), max(1.0, rng.lognormvariate(math.log(self.median), self.sigma)))


@dataclass(frozen=True)
class Workload:
    generators: int
    learner_ranks: int
    groups_per_step: int
    group_size: int
    prompts_per_call: int
    decode_step_s: float
    train_s_per_token: float
    lengths: Lengths = field(default_factory=Lengths)
    ref_rows: float = 1.0
    fixed_rows: float | None = None
    weight_sync_s: float = 0.0
    # Seconds from a version's publication until a generator can apply it (encode, send).
    weight_latency_s: float = 0.0
    drop_rate: float = 0.0


def step_seconds(w: Workload, rows: int) -> float:
    """One decode step of ``rows`` rows (module doc)."""
    if w.fixed_rows is None:
        return w.decode_step_s
    return w.decode_step_s * (w.fixed_rows + rows) / (w.fixed_rows + w.ref_rows)


@dataclass
class _Group:
    min_version: int
    tokens: float


class Simulation:
    """One run of the model: ``steps`` learner steps at staleness bound ``eta``."""

    def __init__(self, w: Workload, eta: int, in_flight: bool, steps: int, seed: int = 0) -> None:
        self.w, self.eta, self.in_flight, self.steps = w, eta, in_flight, steps
        self.rng = random.Random(seed)
        self.now, self.version = 0.0, 0
        self.published = 0  # the newest version generators can apply (after the latency)
        self.policy = AdmissionPolicy(w.groups_per_step, BufferConfig(max_staleness=eta), self)
        self.buffer: list[_Group] = []
        self._heap: list[tuple[float, int, Coroutine]] = []
        self._seq = itertools.count()
        self._waiting: dict[str, list[Coroutine]] = {"version": [], "buffer": []}
        self.step_times: list[float] = []
        self.step_staleness: list[list[int]] = []
        self.busy = {"generator": 0.0, "learner": 0.0}
        self.busy_marks: list[tuple[float, float, float]] = []  # (t, generator, learner)

    def current_version(self) -> int:  # VersionSource for AdmissionPolicy
        return self.version

    # ------------------------------------------------------------------ scheduler

    def _schedule(self, co: Coroutine, at: float) -> None:
        heapq.heappush(self._heap, (at, next(self._seq), co))

    def _advance(self, co: Coroutine) -> None:
        try:
            command = next(co)
        except StopIteration:
            return
        if isinstance(command, str):
            self._waiting[command].append(co)
        else:
            self._schedule(co, self.now + float(command))

    def _notify(self, what: str) -> None:
        waiting, self._waiting[what] = self._waiting[what], []
        for co in waiting:
            self._schedule(co, self.now)

    def run(self) -> None:
        for _ in range(self.w.generators):
            self._schedule(self._generator(), 0.0)
        self._schedule(self._learner(), 0.0)
        while self._heap and self.version < self.steps:
            self.now, _, co = heapq.heappop(self._heap)
            self._advance(co)

    # ------------------------------------------------------------------ roles

    def _generator(self) -> Coroutine:
        w, applied = self.w, 0
        while True:
            grant = self.policy.request(w.prompts_per_call)
            if grant.granted == 0:
                yield "version"
                continue
            while applied < grant.min_version:
                if self.published <= applied:
                    yield "version"
                    continue
                yield w.weight_sync_s
                applied = self.published
            if self.published > applied:  # newer weights are applied between calls
                yield w.weight_sync_s
                applied = self.published
            start_version = applied
            lengths = [
                [w.lengths.draw(self.rng) for _ in range(w.group_size)]
                for _ in range(grant.granted)
            ]
            longest = max(max(group) for group in lengths)
            duration = step_seconds(w, grant.granted * w.group_size) * longest
            yield duration
            self.busy["generator"] += duration
            if self.in_flight and self.published > applied:
                # Versions published during the call were applied in flight: decoding paused.
                yield w.weight_sync_s * (self.published - applied)
                applied = self.published
            for group in lengths:
                if self.rng.random() < w.drop_rate:
                    self.policy.set_dropped(self.policy.dropped + 1)
                    continue
                self.buffer.append(_Group(start_version, sum(group)))
            self._notify("buffer")
            self._notify("version")  # returned budget may admit a waiting generator

    def _learner(self) -> Coroutine:
        w = self.w
        while self.version < self.steps:
            floor = self.version - self.eta
            stale = [g for g in self.buffer if g.min_version < floor]
            if stale:
                self.buffer = [g for g in self.buffer if g.min_version >= floor]
                self.policy.set_dropped(self.policy.dropped + len(stale))
                self._notify("version")
            if len(self.buffer) < w.groups_per_step:
                yield "buffer"
                continue
            batch, self.buffer = self.buffer[: w.groups_per_step], self.buffer[w.groups_per_step :]
            tokens = sum(g.tokens for g in batch)
            duration = tokens * w.train_s_per_token / w.learner_ranks
            yield duration
            self.busy["learner"] += duration
            self.step_staleness.append([self.version - g.min_version for g in batch])
            self.version += 1
            self.step_times.append(self.now)
            self.busy_marks.append((self.now, self.busy["generator"], self.busy["learner"]))
            self._notify("version")  # admission opens at once; the weights arrive later
            self._schedule(self._publish(self.version), self.now)

    def _publish(self, version: int) -> Coroutine:
        yield self.w.weight_latency_s
        self.published = max(self.published, version)
        self._notify("version")


def simulate(w: Workload, eta: int, in_flight: bool, steps: int, warmup: int, seed: int = 0):
    """Throughput and staleness over the steps after ``warmup`` (a dict of figures)."""
    sim = Simulation(w, eta, in_flight, steps, seed)
    sim.run()
    if len(sim.step_times) < steps:
        raise RuntimeError(f"{LABEL}: stalled after {len(sim.step_times)} of {steps} steps")
    opening = warmup - 1
    span = sim.step_times[-1] - sim.step_times[opening]
    measured = steps - warmup
    gen0, learn0 = sim.busy_marks[opening][1:]
    gen1, learn1 = sim.busy_marks[-1][1:]
    staleness = [s for step in sim.step_staleness[warmup:] for s in step]
    histogram: dict[str, int] = {}
    for s in staleness:
        histogram[str(s)] = histogram.get(str(s), 0) + 1
    return {
        "samples_per_s": measured * w.groups_per_step * w.group_size / span,
        "seconds_per_step": span / measured,
        "staleness_mean": sum(staleness) / max(len(staleness), 1),
        "staleness_histogram": histogram,
        "generator_busy": (gen1 - gen0) / (span * w.generators),
        "learner_busy": (learn1 - learn0) / span,
    }


def predict(w: Workload, etas: list[int], steps: int, warmup: int, seed: int = 0) -> dict:
    """Sync and async at each η, with async/sync ratios."""
    sync = simulate(w, 0, False, steps, warmup, seed)
    modes = {"sync": sync}
    for eta in etas:
        result = simulate(w, eta, True, steps, warmup, seed)
        result["async_over_sync"] = result["samples_per_s"] / sync["samples_per_s"]
        modes[f"async-eta{eta}"] = result
    return {"workload": asdict(w), "modes": modes}


# How a decode step's time grows with its rows, for the HF engine (``fixed_rows``):
# CPU: the engine figures on the 2-core AVX512 EPYC (docs/experiments.md, 2026-11-23), 78.1
# tok/s at batch 8 and 115.3 at 16, are steps of 102 and 139 ms: 66 ms + 4.6 ms per row, so
# the fixed part equals 14.5 rows. CUDA: on the H100 a step took 102, 100 and 91 ms at batch
# 8, 64 and 256: launch-bound, the same at any batch (None).
ENGINE_FIXED_ROWS: dict[str, float | None] = {"cpu": 14.5, "cuda": None}


def workload_from_bench(results: dict[str, Any]) -> Workload:
    """Calibrate the model from ``bench throughput``'s results.json: per-call and per-token
    costs from the sync run (each role alone), lengths fixed at the measured mean."""
    sync = next(r for r in results["results"] if r["mode"] == "sync")
    shape = results["shape"]
    steps = sync["steps"]
    samples_per_step = shape["groups_per_step"] * shape["group_size"]
    mean_len = sync["trained_tokens_per_s"] / sync["samples_per_s"]
    calls = max(sync["calls_per_step"] * steps, 1e-9)
    call_s = sync["t_gen_per_step_s"] * steps / calls
    device = shape.get("generator_device", "cpu").split(":")[0]
    tokens_per_step = mean_len * samples_per_step
    generated = max(sync["groups_generated"], 1.0)
    return Workload(
        generators=shape["generators"],
        learner_ranks=shape["learner_ranks"],
        groups_per_step=shape["groups_per_step"],
        group_size=shape["group_size"],
        prompts_per_call=shape["prompts_per_call"],
        decode_step_s=call_s / mean_len,
        ref_rows=sync["rows_per_call"],
        fixed_rows=ENGINE_FIXED_ROWS.get(device, None),
        train_s_per_token=sync["t_train_per_step_s"] * shape["learner_ranks"] / tokens_per_step,
        lengths=Lengths(fixed=mean_len),
        weight_sync_s=sync["generator_weights_pause"] * sync["window_s"] / steps,
        # In sync mode a generator waits for every version: its wait is the latency.
        weight_latency_s=sync["generator_wait_weights"] * sync["window_s"] / steps,
        drop_rate=sync["groups_dropped"] / generated,
    )


# Published per-GPU figures for the projection (each with its source); H100, Llama-3-8B class.
PUBLISHED = {
    "generation_tok_s": (
        6226.0,
        "vLLM PR #7117 (vllm-project/vllm): Meta-Llama-3-8B on one H100, 256 input + 256 output "
        "tokens, 12,453 tokens/s in + out; half of it taken as output tokens/s",
    ),
    "training_tok_s": (
        5762.0,
        "torchtitan docs/performance.md (pytorch/torchtitan): Llama-3.1-8B, FSDP2, bf16, "
        "8 x H100, 5,762 tokens/s per GPU",
    ),
}
# What the projection assumes beyond the published figures (no published source found).
ASSUMED = {
    "rl_learner_cost": "x4/3 per token: the proximal-logprob forward beside forward + backward",
    "lengths": "log-normal, median 1,000 tokens, sigma 0.8, capped at 8,192",
    "weight_sync_s": "2.0 s per version (marin #9171 reports a 1.6 s trainer pause for one "
    "per-update weight copy of a 67B model)",
    "shape": "learner GPUs = generator GPUs; group_size 16; 4 prompts per call (64 rows); "
    "groups_per_step = 4 x generator GPUs",
}


def projection_workload(gpus: int) -> Workload:
    rows = 4 * 16
    gen_tok_s, train_tok_s = PUBLISHED["generation_tok_s"][0], PUBLISHED["training_tok_s"][0]
    return Workload(
        generators=gpus,
        learner_ranks=gpus,
        groups_per_step=4 * gpus,
        group_size=16,
        prompts_per_call=4,
        # A call's rows share the GPU's decode rate; the call lasts until its longest row ends.
        decode_step_s=rows / gen_tok_s,
        ref_rows=rows,
        fixed_rows=0.0,
        train_s_per_token=(4 / 3) / train_tok_s,
        lengths=Lengths(median=1000.0, sigma=0.8, cap=8192),
        weight_sync_s=2.0,
    )


def _format_mode(name: str, r: dict[str, Any]) -> str:
    hist = ", ".join(f"{k}: {v}" for k, v in sorted(r["staleness_histogram"].items()))
    return (
        f"{name:<12} {r['samples_per_s']:>10.3f} samples/s, {r['seconds_per_step']:>8.2f} s/step, "
        f"generator busy {100 * r['generator_busy']:>3.0f}%, learner busy "
        f"{100 * r['learner_busy']:>3.0f}%, staleness {r['staleness_mean']:.2f} ({hist})"
    )


def bench_simulate(
    results_path: Path | None,
    etas: list[int],
    steps: int,
    warmup: int,
    gpus: list[int],
    out: Path | None,
    console=sys.stdout,
    seed: int = 0,
) -> dict[str, Any]:
    """Validate against ``bench throughput``'s results (when given; its own window), then
    project to ``gpus`` generator GPUs with the published figures over ``steps`` steps after
    ``warmup``; print and (with ``out``) write JSON."""
    report: dict[str, Any] = {"label": LABEL}
    print(
        f"{LABEL}: a discrete-event model of streamrl's admission, buffer and staleness rules",
        file=console,
    )
    if results_path is not None:
        measured = json.loads(Path(results_path).read_text())
        workload = workload_from_bench(measured)
        runs = {r["name"]: r for r in measured["results"]}
        etas_measured = sorted(r["eta"] for r in measured["results"] if r["mode"] == "async")
        meta = measured["meta"]
        total = meta["warmup"] + meta["steps"]
        prediction = predict(workload, etas_measured, total, meta["warmup"], seed)
        print(f"\n{LABEL} calibrated from {results_path} (its sync run):", file=console)
        rows = []
        for name, predicted in prediction["modes"].items():
            actual = runs[name]["samples_per_s"]
            error = predicted["samples_per_s"] / actual - 1
            rows.append(
                {
                    "mode": name,
                    "predicted": predicted["samples_per_s"],
                    "measured": actual,
                    "error": error,
                }
            )
            print(
                f"{name:<12} predicted {predicted['samples_per_s']:.3f} samples/s, measured "
                f"{actual:.3f}: {100 * error:+.1f}%"
                + (
                    f"; staleness predicted {predicted['staleness_mean']:.2f}, measured "
                    f"{runs[name]['staleness_mean']:.2f}"
                    if name != "sync"
                    else ""
                ),
                file=console,
            )
        report["validation"] = {"prediction": prediction, "rows": rows}
    print(f"\n{LABEL} projection, H100, Llama-3-8B class; published per-GPU figures:", file=console)
    for value, source in PUBLISHED.values():
        print(f"  {value:,.0f} tokens/s: {source}", file=console)
    print("assumed: " + "; ".join(f"{k}: {v}" for k, v in ASSUMED.items()), file=console)
    report["projection"] = {"published": PUBLISHED, "assumed": ASSUMED, "runs": {}}
    for n in gpus:
        prediction = predict(projection_workload(n), etas, warmup + steps, warmup, seed)
        report["projection"]["runs"][str(n)] = prediction
        print(f"\n{n} generator GPUs + {n} learner GPUs ({LABEL}):", file=console)
        for name, r in prediction["modes"].items():
            ratio = f", async/sync {r['async_over_sync']:.2f}x" if "async_over_sync" in r else ""
            print(_format_mode(name, r) + ratio, file=console)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "simulation.json").write_text(json.dumps(report, indent=1))
        print(f"\nwrote {out / 'simulation.json'}", file=console)
    return report
