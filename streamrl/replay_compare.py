"""``streamrl replay RUN_DIR --compare``: a run's replay arms side by side (torch-free).

Reads ``RUN_DIR/replays/<arm>.jsonl`` (``workers.learning.replay``) and prints one row per arm:
the mean over its replayed steps of the figures that say how a loss or correction behaved, and
its divergence from the original policy at its last step.

Example (a 5-step tiny run, and an arm with a higher learning rate)::

    arm               steps  reward   loss      is_w_mean  is_ess  ...  |dlogp|_orig  k3_orig
    original          5      0.01562  -0.02821  1.003      0.9875  ...  -             -
    learner.lr=0.003  5      0.01562  -0.03324  1.005      0.9549  ...  0.1133        0.01178
"""

from __future__ import annotations

import json
import math
from pathlib import Path

# (column, metric, how): "mean" over the replayed steps, "last" at the last one.
COLUMNS = (
    ("reward", "reward/mean", "mean"),
    ("loss", "loss/total", "mean"),
    ("is_w_mean", "policy/is_weight_mean", "mean"),
    ("is_ess", "policy/is_ess", "mean"),
    ("offpol_k3", "policy/offpolicy_k3", "mean"),
    ("clip_up", "policy/clipfrac_upper", "mean"),
    ("clip_low", "policy/clipfrac_lower", "mean"),
    ("grad_norm", "train/grad_norm", "mean"),
    ("entropy", "replay/entropy", "mean"),
    ("|dlogp|_orig", "replay/logprob_abs_from_original", "last"),
    ("k3_orig", "replay/k3_from_original", "last"),
    ("held_out", "eval/completed", "last"),  # the last evaluation's (--eval-at)
    ("success", "eval/success", "last"),  # multi-turn jobs'
)


def read_arms(run_dir: Path) -> dict[str, list[dict]]:
    """Each replayed arm's per-step figures, the original first."""
    arms: dict[str, list[dict]] = {}
    for path in sorted((run_dir / "replays").glob("*.jsonl"), key=lambda p: p.stem != "original"):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if rows:
            arms[path.stem] = rows
    return arms


def _figure(rows: list[dict], metric: str, how: str) -> float | None:
    values = [r[metric] for r in rows if isinstance(r.get(metric), (int, float))]
    if not values:
        return None
    return values[-1] if how == "last" else sum(values) / len(values)


def _cell(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.4g}"


def compare_table(run_dir: Path) -> str:
    """The arms of ``run_dir`` side by side, or a line saying there are none."""
    arms = read_arms(run_dir)
    if not arms:
        return f"{run_dir}: no replays yet (run `streamrl replay {run_dir}` first)"
    # A column no arm has (held-out figures without --eval-at) is left out.
    shown = [
        c for c in COLUMNS if any(_figure(rows, c[1], c[2]) is not None for rows in arms.values())
    ]
    table = [["arm", "steps"] + [c for c, _, _ in shown]]
    for arm, rows in arms.items():
        figures = [_cell(_figure(rows, metric, how)) for _, metric, how in shown]
        steps = sum(1 for r in rows if r.get("step", 0) > 0)  # row 0: an evaluation only
        table.append([arm, str(steps), *figures])
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in table
    )
