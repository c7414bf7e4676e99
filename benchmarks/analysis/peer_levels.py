"""Every held-out level a peer's run reached, and how much sooner streamrl's runs reached it:
issue 54's "every level TRL's peer reaches on the same recipe, reached at least 3x sooner".

    .venv/bin/python benchmarks/analysis/peer_levels.py runs/trl-peer/result.json \\
        runs/A runs/B [--metric exact] [--ratio 3]

The peer's levels: each evaluation after the one before training whose figure beats every
earlier one, at its ``seconds`` (``benchmarks/trl_peer.py``'s training clock, its evaluations
included). A streamrl run's time to a level: seconds from the start of its first step to the
step that made the first version whose evaluation reached it (the clock ``run_pace.py`` uses),
or none. ``--metric exact`` reads the peer's ``exact`` and streamrl's ``eval/exact_match``;
``completed`` reads ``completed`` and ``eval/completed``.

The peer's time is known only at its evaluations: it may have crossed a level up to an
evaluation interval earlier, so each ratio is an upper bound of the true one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from streamrl.clock import evaluated_version, live_records
from streamrl.hardware import cpu_description

METRICS = {"exact": "eval/exact_match", "completed": "eval/completed"}


def peer_levels(result: dict[str, Any], key: str) -> list[tuple[float, float]]:
    """``(level, seconds)`` of each evaluation that beat every earlier one (module doc)."""
    curve = result["curve"]
    best, out = curve[0][key], []
    for point in curve[1:]:
        if point[key] > best:
            best = point[key]
            out.append((best, float(point["seconds"])))
    return out


def times_to_levels(run: Path, metric: str, levels: list[float]) -> list[float | None]:
    """For each level, the training-clock seconds to the first version that reached it."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    records = live_records([json.loads(line) for line in lines if line.strip()])
    steps = [r for r in records if "step" in r]
    start = steps[0]["time"] - steps[0].get("time/step_s", 0.0)
    made_at = {r["step"]: r["time"] - start for r in steps}
    made_at[0] = 0.0
    evals = [
        (evaluated_version(r), r[metric])
        for r in records
        if r.get("event") == "eval" and metric in r and evaluated_version(r) in made_at
    ]
    return [min((made_at[v] for v, x in evals if x >= level), default=None) for level in levels]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("peer", type=Path, help="the peer's result.json")
    parser.add_argument("runs", nargs="+", type=Path, help="streamrl run directories")
    parser.add_argument("--metric", choices=list(METRICS), default="exact")
    parser.add_argument("--ratio", type=float, default=3.0, help="the mark: this many times")
    args = parser.parse_args()
    result = json.loads(args.peer.read_text())
    levels = peer_levels(result, args.metric)
    print(f"# {cpu_description()}; peer {result.get('cpu', '?')}, {result.get('capability', '?')}")
    print(f"| level | peer | {' | '.join(r.name for r in args.runs)} |")
    met = total = 0
    per_run = [times_to_levels(r, METRICS[args.metric], [x for x, _ in levels]) for r in args.runs]
    for i, (level, seconds) in enumerate(levels):
        cells = []
        for times in per_run:
            t = times[i]
            total += 1
            if t is None:
                cells.append("never")
                continue
            ratio = seconds / max(t, 1e-9)
            met += ratio >= args.ratio
            cells.append(f"{t:.0f} s ({ratio:.1f}x)")
        print(f"| {100 * level:.1f}% | {seconds:.0f} s | {' | '.join(cells)} |")
    print(f"{met} of {total} pairs at least {args.ratio:g}x sooner")


if __name__ == "__main__":
    main()
