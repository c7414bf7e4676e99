"""What the training record costs a run, and what a replay of it costs and finds.

From a finished run directory: the record's bytes per step on disk (per rank file), the
learner's seconds per step spent on it (``record/s``: the weights digest and the write) against
its busy seconds, then ``streamrl replay`` of the run timed (seconds per replayed step, bitwise
or the first step that differs). With ``--set`` the replay also trains that counterfactual arm.

    .venv/bin/python benchmarks/replay.py runs/NAME [--set algorithm.correction=none] [--until 40]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from streamrl.bench.report import machine
from streamrl.config import parse_overrides
from streamrl.workers.learning.replay import ReplayRequest, replay
from streamrl.workers.learning.training_record import RECORD_DIR, read_record


def record_cost(run_dir: Path) -> dict[str, float]:
    """Bytes per step on disk and the learner's seconds per step on the record (rank 0's)."""
    record = read_record(run_dir)
    files = sorted((run_dir / RECORD_DIR).glob("*.arrow"))
    steps = max(len(record.steps), 1)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    rows = [r for r in map(json.loads, lines) if "record/s" in r]
    return {
        "steps": float(len(record.steps)),
        "ranks": float(len(record.ranks)),
        "bytes_per_step_all_ranks": sum(f.stat().st_size for f in files) / steps,
        "record_s_median": statistics.median(r["record/s"] for r in rows) if rows else 0.0,
        "record_s_max": max((r["record/s"] for r in rows), default=0.0),
        "busy_s_median": statistics.median(r["time/busy_s"] for r in rows) if rows else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--set", dest="assignments", action="append", default=[])
    parser.add_argument("--until", type=int)
    args = parser.parse_args()
    print(json.dumps(machine()))
    cost = record_cost(args.run_dir)
    share = cost["record_s_median"] / max(cost["busy_s_median"], 1e-9)
    print(
        f"record: {cost['steps']:.0f} steps x {cost['ranks']:.0f} rank(s), "
        f"{cost['bytes_per_step_all_ranks'] / 1024:.0f} KiB per step on disk; "
        f"{1000 * cost['record_s_median']:.1f} ms per step median "
        f"({1000 * cost['record_s_max']:.1f} max), {100 * share:.1f}% of the learner's busy time"
    )
    start = time.perf_counter()
    result = replay(
        ReplayRequest(args.run_dir, parse_overrides(args.assignments), until_step=args.until)
    )
    seconds = time.perf_counter() - start
    per_step = seconds / max(len(result.replayed), 1)
    verdict = "bitwise" if result.bitwise else f"differs at step {result.first_mismatch}"
    print(
        f"replay: {len(result.replayed)} steps in {seconds:.1f} s ({per_step:.2f} s per step, "
        f"{'2 arms' if args.assignments else '1 arm'}, model loads included): {verdict}"
    )
    for problem in result.problems:
        print(f"record: {problem}")


if __name__ == "__main__":
    main()
