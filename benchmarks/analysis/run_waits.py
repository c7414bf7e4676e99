"""Where a run's generator time went, from its metrics: admission wait and busy seconds, groups
generated and groups per engine call, the learner's total wait for batches and the training
loop's wall seconds; one line per run.

    .venv/bin/python benchmarks/analysis/run_waits.py runs/NAME [runs/OTHER/metrics.jsonl.gz ...]

Each argument is a run directory (its ``metrics.jsonl``) or a metrics file, gzipped or not.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path


def read_metrics(path: Path) -> list[dict]:
    if path.is_dir():
        path = path / "metrics.jsonl"
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories or metrics files")
    for path in parser.parse_args().runs:
        steps = [r for r in read_metrics(path) if "time/step_s" in r]
        last = steps[-1]
        groups = last["generators/groups_total"]
        print(
            path,
            "admission wait",
            round(last["generators/wait_admission_s_total"], 1),
            "busy",
            round(last["generators/busy_s_total"], 1),
            "groups",
            groups,
            "groups/call",
            round(groups / last["generators/calls_total"], 2),
            "learner wait",
            round(sum(r["time/wait_batch_s"] for r in steps)),
            "loop wall",
            round(last["time"] - steps[0]["time"]),
        )


if __name__ == "__main__":
    main()
