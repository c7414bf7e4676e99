"""Per run: the generator's admission wait and busy time, groups generated and per call, the
learner's total wait for data and the training loop's wall time (``runs/NAME/metrics.jsonl``).

Run from the checkout's root: ``.venv/bin/python benchmarks/results/default-2026-11-26b/generator_waits.py NAME...``.
"""  # noqa: E501

from __future__ import annotations

import json
import sys


def main() -> None:
    for name in sys.argv[1:]:
        with open(f"runs/{name}/metrics.jsonl") as lines:
            rows = [json.loads(line) for line in lines]
        steps = [r for r in rows if "time/step_s" in r]
        last = steps[-1]
        groups = last["generators/groups_total"]
        print(
            name,
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
            round(steps[-1]["time"] - steps[0]["time"]),
        )


if __name__ == "__main__":
    main()
