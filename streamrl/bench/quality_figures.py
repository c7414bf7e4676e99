"""The PNGs of ``streamrl bench quality``: per arm the median over seeds as a line and the
min-max range as a band, so a reader sees at once whether two arms differ by more than the
seeds do.

- ``quality_by_samples.png``: the held-out metric against trained samples (sample
  efficiency), beside the raw train reward;
- ``quality_by_time.png``: the held-out metric against seconds on the training clock
  (``quality_runs``), with the target.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _draw(ax: Any, band: list[dict], axis: str, label: str) -> None:
    if not band:
        return
    xs = [p[axis] for p in band]
    (line,) = ax.step(xs, [p["median"] for p in band], where="post", label=label)
    ax.fill_between(
        xs,
        [p["min"] for p in band],
        [p["max"] for p in band],
        step="post",
        alpha=0.2,
        color=line.get_color(),
    )


def plots(summary: dict[str, Any], out: Path, metric: str, target: float) -> list[Path]:
    """Write both PNGs from ``quality_stats.aggregate``'s summary; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = {arm: row for arm, row in summary["arms"].items() if row.get("finished")}
    label = f"held-out {metric}"
    paths = []

    fig, (held_out, reward) = plt.subplots(1, 2, figsize=(11, 4))
    for arm, row in arms.items():
        _draw(held_out, row["by_samples"], "samples", f"{arm} ({row['finished']})")
        _draw(reward, row["train_reward"], "samples", arm)
    held_out.axhline(target, color="grey", linestyle=":", linewidth=1)
    held_out.set(xlabel="trained samples", ylabel=label, title=f"{label} at equal samples")
    reward.set(xlabel="trained samples", ylabel="train reward (batch mean)", title="train reward")
    held_out.legend(fontsize="small", title="arm (seeds)")
    fig.tight_layout()
    paths.append(out / "quality_by_samples.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for arm, row in arms.items():
        _draw(ax, row["by_time"], "seconds", f"{arm} ({row['finished']})")
    ax.axhline(target, color="grey", linestyle=":", linewidth=1, label=f"target {target:g}")
    ax.set(xlabel="seconds of training (setup excluded)", ylabel=label)
    ax.set_title(f"{label} at equal time")
    ax.legend(fontsize="small")
    fig.tight_layout()
    paths.append(out / "quality_by_time.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
