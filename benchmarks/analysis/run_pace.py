"""A launched run's pace and learning, from its run directory: samples/s after the warm-up,
where the generators' time went (busy, weight-apply pauses, evaluation, waits), the learner's
busy fraction, publish -> applied (median and worst over the steps), the staleness bound
over the run, the time to a held-out accuracy and the final accuracy. One line per run and
``--json`` for all of them.

    .venv/bin/python benchmarks/analysis/run_pace.py runs/NAME [runs/OTHER ...] [--warmup 5]

Time to a target: seconds from the first step record to the step that produced the first
version whose evaluation reached it (``eval/exact_match`` by default), or None: when the
learner made those weights, however late the evaluation ran (``eval.runs_on: slack``). The
version is the one evaluated (``eval/version``), not the one asked for (``requested``): an
evaluation process starved of cores answers an old ask with newer weights (a distillation run
with a slack evaluator answered its v5-v35 asks with v40's weights, 2026-12-07).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from streamrl.bench.throughput import measure
from streamrl.clock import evaluated_version
from streamrl.config import load_config
from streamrl.hardware import cpu_description


def _records(run: Path) -> list[dict[str, Any]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def run_pace(run: Path, warmup: int, metric: str, target: float) -> dict[str, Any]:
    """The figures of one run directory (module doc)."""
    records = _records(run)
    config = load_config(str(run / "config.yaml"), [])
    figures = measure(records, warmup, config)
    steps = [r for r in records if "step" in r]
    evals = [r for r in records if r.get("event") == "eval" and metric in r]
    start = steps[0]["time"] - steps[0].get("time/step_s", 0.0)
    opening = steps[warmup - 1] if warmup > 0 else steps[0]
    span = steps[-1]["time"] - opening["time"]
    n_gen = max(int(steps[-1].get("generators/count", 1)), 1)
    eval_s = steps[-1].get("generators/eval_s_total", 0.0) - opening.get(
        "generators/eval_s_total", 0.0
    )
    latencies = [r["weights/publish_to_applied_s_max"] for r in steps[warmup:]]
    latencies = [x for x in latencies if x > 0]
    reached = next((r for r in evals if r[metric] >= target), None)
    made_at = {r["step"]: r["time"] for r in steps}
    bounds = [r["staleness/bound"] for r in steps if "staleness/bound" in r]
    return {
        "run": str(run),
        "samples_per_s": figures["samples_per_s"],
        "generator_busy": figures["generator_busy"],
        "generator_weights_pause": figures["generator_weights_pause"],
        "generator_eval": eval_s / (span * n_gen),
        "generator_wait_admission": figures["generator_wait_admission"],
        "generator_wait_weights": figures["generator_wait_weights"],
        "learner_busy": figures["learner_busy"],
        "publish_to_applied_median_s": statistics.median(latencies) if latencies else None,
        "publish_to_applied_max_s": max(latencies, default=None),
        "staleness_bound_range": [min(bounds), max(bounds)] if bounds else None,
        "time_to_target_s": made_at.get(evaluated_version(reached), reached["time"]) - start
        if reached
        else None,
        "evaluations": len(evals),
        "final": evals[-1][metric] if evals else None,
        "wall_s": steps[-1]["time"] - start,
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories")
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the rates")
    parser.add_argument("--metric", default="eval/exact_match")
    parser.add_argument("--target", type=float, default=0.5)
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    args = parser.parse_args()
    print(f"# {cpu_description()}")
    rows = [run_pace(run, args.warmup, args.metric, args.target) for run in args.runs]
    for r in rows:
        tt = r["time_to_target_s"]
        print(
            f"{r['run']}: {r['samples_per_s']:.2f} samples/s | generator busy "
            f"{_pct(r['generator_busy'])}, weight pauses {_pct(r['generator_weights_pause'])}, "
            f"eval {_pct(r['generator_eval'])}, waits admission "
            f"{_pct(r['generator_wait_admission'])} weights {_pct(r['generator_wait_weights'])}"
            f" | learner busy {_pct(r['learner_busy'])} | publish->applied median "
            f"{_s(r['publish_to_applied_median_s'])} max {_s(r['publish_to_applied_max_s'])} | "
            f"bound {r['staleness_bound_range']} | {args.metric} >= {args.target}: "
            f"{'never' if tt is None else f'{tt:.0f}s'} | final {r['final']} | "
            f"wall {r['wall_s']:.0f}s"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
