"""Throughput of asynchronous vs synchronous mode on the same job (prints its figures).

Both modes run the same machinery (``--mode sync`` is ``max_staleness=0`` without in-flight
updates), the same config, the same number of steps. Figures are measured between the first
and the last learner step, so process start-up and model loading are excluded:

- steps/s and trained response tokens/s (what the learner consumed),
- generated tokens/s (what the generators produced, wasted or not),
- mean staleness of the consumed batches.

Usage:
    python benchmarks/sync_vs_async.py                       # tiny model, 12 steps
    python benchmarks/sync_vs_async.py --model smollm2-135m-instruct --steps 6 \
        --learners 1 --generators 1
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
from pathlib import Path

from streamrl.config import load_config
from streamrl.launch import Controller

ROOT = Path(__file__).resolve().parents[1]


def run_mode(mode: str, args: argparse.Namespace, out_dir: str) -> dict[str, float]:
    overrides = [
        f"run.output_dir={out_dir}",
        f"run.name={mode}",
        f"run.mode={mode}",
        f"run.max_steps={args.steps}",
        f"model.name={args.model}",
        f"learner.count={args.learners}",
        f"generator.count={args.generators}",
        f"buffer.max_staleness={args.staleness}",
        "logging.progress=false",
        *args.overrides,
    ]
    config = load_config(ROOT / "configs" / args.config, overrides)
    summary = Controller(config, console=io.StringIO()).run()
    lines = (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    steps = [r for r in map(json.loads, lines) if "step" in r]
    first, last = steps[0], steps[-1]
    elapsed = last["time"] - first["time"]
    measured = steps[1:]  # the first step's batch was generated before the clock started
    trained = sum(r["train/response_tokens"] for r in measured)
    return {
        "steps": len(measured),
        "seconds": elapsed,
        "steps_per_s": len(measured) / elapsed,
        "trained_tok_per_s": trained / elapsed,
        "generated_tok_per_s": sum(r["throughput/tokens_per_s"] for r in measured) / len(measured),
        "staleness_mean": sum(r["staleness/mean"] for r in measured) / len(measured),
        "reward_last": last["reward/mean"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny.yaml")
    parser.add_argument("--model", default="tiny-random-llama")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--learners", type=int, default=2)
    parser.add_argument("--generators", type=int, default=2)
    parser.add_argument("--staleness", type=int, default=2, help="async max_staleness")
    parser.add_argument("overrides", nargs="*", help="extra section.key=value overrides")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out_dir:
        results = {mode: run_mode(mode, args, out_dir) for mode in ("sync", "async")}
    print(
        f"\nmodel {args.model}, {args.learners} learner(s), {args.generators} generator(s), "
        f"{args.steps} steps (first excluded), async max_staleness {args.staleness}"
    )
    header = (
        f"{'mode':<6} {'steps/s':>8} {'trained tok/s':>14} {'generated tok/s':>16} "
        f"{'staleness':>10} {'seconds':>8}"
    )
    print(header)
    print("-" * len(header))
    for mode, r in results.items():
        print(
            f"{mode:<6} {r['steps_per_s']:>8.3f} {r['trained_tok_per_s']:>14.1f} "
            f"{r['generated_tok_per_s']:>16.1f} {r['staleness_mean']:>10.2f} {r['seconds']:>8.1f}"
        )
    speedup = results["async"]["steps_per_s"] / results["sync"]["steps_per_s"]
    print(f"async / sync steps/s: {speedup:.2f}x")


if __name__ == "__main__":
    main()
