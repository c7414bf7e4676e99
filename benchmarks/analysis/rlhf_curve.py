"""An RLHF run's curve: at every evaluation, the true accuracy (the rule's exact check,
``eval/exact_match``) beside the reward model's mean score (``eval/reward/<label>``), and the
learner's KL to the reference at that step; one table per run, and with ``--png`` a figure.

    .venv/bin/python benchmarks/analysis/rlhf_curve.py runs/rlhf-s0 [runs/rlhf-s1 ...] [--png F]

The two rising together is learning; the model reward rising while the accuracy falls is
over-optimisation of the reward model (docs/design.md §7c, README "RLHF").
"""

from __future__ import annotations

import argparse
from pathlib import Path

from run_waits import read_metrics

from streamrl.clock import evaluated_version


def curve(records: list[dict]) -> list[dict[str, float]]:
    """Per evaluation: version, seconds since the first record, exact match, each served
    reward's mean score, and ``kl/ref`` of the step evaluated (NaN before any step)."""
    start = min(r["time"] for r in records if "time" in r)
    kl = {r["step"]: r.get("kl/ref", float("nan")) for r in records if "step" in r}
    rows = []
    for e in (r for r in records if r.get("event") == "eval"):
        version = evaluated_version(e)  # evaluated, not asked for
        row = {
            "version": version,
            "seconds": e["time"] - start,
            "exact_match": e["eval/exact_match"],
            "kl_ref": kl.get(version, float("nan")),
        }
        for key, value in e.items():
            if key.startswith("eval/reward/") and not key.endswith("/unparsable"):
                row[key.removeprefix("eval/")] = value
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories or metrics files")
    parser.add_argument("--png", type=Path, help="also draw the curves here (matplotlib)")
    args = parser.parse_args()
    curves = {str(path): curve(read_metrics(path)) for path in args.runs}
    for name, rows in curves.items():
        keys = [k for k in rows[0] if k.startswith("reward/")] if rows else []
        print(f"{name}\n| version | s | exact match | " + " | ".join(keys) + " | KL to ref |")
        print("|---" * (4 + len(keys)) + "|")
        for r in rows:
            rewards = " | ".join(f"{r.get(k, float('nan')):.3f}" for k in keys)
            print(
                f"| {r['version']} | {r['seconds']:.0f} | {100 * r['exact_match']:.1f}% | "
                f"{rewards} | {r['kl_ref']:.3f} |"
            )
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (acc, rm) = plt.subplots(1, 2, figsize=(9, 3.5))
        for name, rows in curves.items():
            label = Path(name).name
            acc.plot([r["version"] for r in rows], [r["exact_match"] for r in rows], label=label)
            for key in (k for k in rows[0] if k.startswith("reward/")):
                rm.plot([r["version"] for r in rows], [r[key] for r in rows], label=label)
        acc.set(xlabel="version", ylabel="held-out exact match (true accuracy)")
        rm.set(xlabel="version", ylabel="reward model's mean score")
        acc.legend()
        fig.tight_layout()
        fig.savefig(args.png, dpi=100)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
