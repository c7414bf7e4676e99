"""The figures of ``streamrl bench quality`` from per-run results (``quality_runs``' shape):
time to a target held-out accuracy, the metric at equal samples and at equal wall time, the
projected ceiling of each run's curve (a saturating fit), and each arm's median and range
over seeds.

Values between evaluations are read step-wise (the last eval at or before the point): the
model is only known where it was evaluated, and interpolating would credit a run with an
accuracy it had not shown yet. A seed that never reaches the target counts as later than
any that did, so an arm's median time is "not reached" when most of its seeds missed.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

INF = math.inf
METRICS = ("completed", "exact", "reward_mean")


def time_to_target(curve: list[dict[str, float]], metric: str, target: float) -> dict | None:
    """The first eval (in wall time) whose ``metric`` is at least ``target``:
    ``{"seconds", "samples"}``, or None if the run never got there."""
    for point in sorted(curve, key=lambda p: p["seconds"]):
        if point[metric] >= target:
            return {"seconds": point["seconds"], "samples": point["samples"]}
    return None


def projected_ceiling(curve: list[dict[str, float]], metric: str) -> float | None:
    """Where the run's held-out curve was heading: the asymptote ``A`` of ScaleRL's sigmoidal
    fit (Khatri et al. 2025, arXiv 2510.13913), on seconds of the training clock since the
    first evaluation (``t``), with ``R0`` the first evaluation's value:

        metric(t) = R0 + (A - R0) / (1 + (t_mid / t) ** B)

    by least squares: for each ``(t_mid, B)`` on a grid (``t_mid`` from a twentieth of the
    run's span to five spans, log-spaced; ``B`` 1 to 6) ``A`` is linear. Clipped to [0, 1].
    The sigmoid, not an exponential, because a run's curve often sits flat before it climbs.
    None with fewer than 3 evaluations after the first, or when the fit had not covered two
    thirds of its rise by the run's end: the curve had not turned yet, and a ceiling read
    from it would be invented."""
    points = sorted((p["seconds"], p[metric]) for p in curve if metric in p)
    if len(points) < 4:
        return None
    t0, r0 = points[0]
    span = points[-1][0] - t0
    if span <= 0:
        return None
    rest = [(t - t0, y - r0) for t, y in points[1:]]
    best: tuple[float, float, float] | None = None  # (squared error, A - R0, share at end)
    for i in range(41):
        t_mid = span / 20 * (100 ** (i / 40))
        for b in (1.0, 1.5, 2.0, 3.0, 4.0, 6.0):
            g = [1 / (1 + (t_mid / t) ** b) for t, _ in rest]
            gg = sum(x * x for x in g)
            if gg < 1e-12:
                continue
            rise = sum(x * y for x, (_, y) in zip(g, rest, strict=True)) / gg
            error = sum((rise * x - y) ** 2 for x, (_, y) in zip(g, rest, strict=True))
            if best is None or error < best[0]:
                best = (error, rise, g[-1])
    if best is None or best[2] < 2 / 3:
        return None
    return min(max(r0 + best[1], 0.0), 1.0)


def value_at(curve: list[dict[str, float]], axis: str, x: float, metric: str) -> float | None:
    """``metric`` of the last eval at or before ``x`` on ``axis`` (``samples`` or
    ``seconds``); None before the first eval."""
    value = None
    for point in sorted(curve, key=lambda p: p[axis]):
        if point[axis] > x:
            break
        value = point[metric]
    return value


def spread(values: list[float]) -> dict[str, float | None]:
    """Median, min and max (None for an empty list; infinities stay, as "not reached")."""
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _finite(stats: dict[str, float | None]) -> dict[str, float | None]:
    """JSON has no infinity: a "not reached" bound is written as None."""
    return {k: (None if v is not None and math.isinf(v) else v) for k, v in stats.items()}


def _known(runs: list[dict], axis: str, x: float, metric: str) -> list[float]:
    """``metric`` at ``x`` of each run that had been evaluated by then."""
    values = (value_at(r["curve"], axis, x, metric) for r in runs)
    return [v for v in values if v is not None]


def _band(runs: list[dict], axis: str, grid: list[float], metric: str) -> list[dict]:
    """Median and range over seeds at each grid point; a point some seed has no eval for
    yet is left out (the band would mix different sets of seeds)."""
    band = []
    for x in grid:
        values = [value_at(r["curve"], axis, x, metric) for r in runs]
        if all(v is not None for v in values):
            band.append({axis: x, **spread(values)})
    return band


def aggregate(
    results: dict[str, dict[int, dict[str, Any] | None]],
    metric: str,
    target: float,
) -> dict[str, Any]:
    """Per arm over its finished seeds: the final figures at equal samples (the fewest samples
    any finished run trained, normally every run's last eval), the metric at equal wall time
    (at the end of the fastest run, and on a grid up to the slowest), time to target, and
    the median curves with their ranges for the plots."""
    ok = {
        arm: [r for r in by_seed.values() if r is not None and "failed" not in r]
        for arm, by_seed in results.items()
    }
    finished = [r for runs in ok.values() for r in runs]
    if not finished:
        return {"equal_samples": None, "equal_time": None, "arms": {}}
    at_samples = min(max(p["samples"] for p in r["curve"]) for r in finished)
    at_time = min(max(p["seconds"] for p in r["curve"]) for r in finished)
    end_time = max(max(p["seconds"] for p in r["curve"]) for r in finished)
    arms = {}
    for arm, by_seed in results.items():
        runs = ok[arm]
        failed = {s: r["failed"] for s, r in by_seed.items() if r is not None and "failed" in r}
        row: dict[str, Any] = {
            "seeds": len(by_seed),
            "finished": len(runs),
            "failed": failed,
            "pending": [s for s, r in by_seed.items() if r is None],
        }
        if runs:
            hits = [time_to_target(r["curve"], metric, target) for r in runs]
            # Step-wise curves change only at evals: those points (and the end) lose nothing.
            sample_grid = sorted({p["samples"] for r in runs for p in r["curve"]})
            time_grid = sorted({p["seconds"] for r in runs for p in r["curve"]} | {end_time})
            row.update(
                final={m: spread(_known(runs, "samples", at_samples, m)) for m in METRICS},
                at_time={m: spread(_known(runs, "seconds", at_time, m)) for m in METRICS},
                time_to_target={
                    "reached": sum(h is not None for h in hits),
                    "seconds": _finite(spread([h["seconds"] if h else INF for h in hits])),
                    "samples": _finite(spread([h["samples"] if h else INF for h in hits])),
                },
                ceiling=spread(
                    [c for r in runs if (c := projected_ceiling(r["curve"], metric)) is not None]
                ),
                wall_s=spread([r["wall_s"] for r in runs]),
                groups=spread([r["groups_generated"] for r in runs if "groups_generated" in r]),
                dropped=spread([r["groups_dropped"] for r in runs if "groups_dropped" in r]),
                useful=spread(
                    [r["useful_generation"] for r in runs if r.get("useful_generation") is not None]
                ),
                setup_s=spread([r["setup_s"] for r in runs if r.get("setup_s") is not None]),
                by_samples=_band(runs, "samples", sample_grid, metric),
                by_time=_band(runs, "seconds", time_grid, metric),
                train_reward=_reward_band(runs),
            )
        arms[arm] = row
    return {"equal_samples": at_samples, "equal_time": at_time, "arms": arms}


def _reward_band(runs: list[dict]) -> list[dict]:
    """The raw train reward's median and range over seeds at each logged sample count."""
    by_samples: dict[float, list[float]] = {}
    for r in runs:
        for samples, reward in r["train_reward"]:
            by_samples.setdefault(float(samples), []).append(float(reward))
    return [
        {"samples": s, **spread(v)} for s, v in sorted(by_samples.items()) if len(v) == len(runs)
    ]


def _pct(stats: dict[str, float | None]) -> str:
    if stats["median"] is None:
        return "-"
    return f"{100 * stats['median']:.1f}% [{100 * stats['min']:.1f}-{100 * stats['max']:.1f}]"


def _seconds(ttt: dict[str, Any], seeds: int) -> str:
    s = ttt["seconds"]
    if s["median"] is None:
        return f"not reached ({ttt['reached']}/{seeds})"
    top = "not reached" if s["max"] is None else f"{s['max']:.0f}"
    return f"{s['median']:.0f} s [{s['min']:.0f}-{top}] ({ttt['reached']}/{seeds})"


def _groups(row: dict[str, Any]) -> str:
    """Median groups generated (dropped) over seeds; '-' for results from before they were kept."""
    groups, dropped = row.get("groups", {}).get("median"), row.get("dropped", {}).get("median")
    if groups is None:
        return "-"
    useful = row.get("useful", {}).get("median")
    return f"{groups:.0f} ({dropped:.0f})" + ("" if useful is None else f" {100 * useful:.0f}%")


def table(summary: dict[str, Any], metric: str, target: float) -> str:
    """The printed table: one row per arm; figures are median [min-max] over finished seeds,
    seconds on the training clock (``quality_runs``), setup beside the wall time."""
    n, t = summary["equal_samples"], summary["equal_time"]
    n_text = "-" if n is None else f"{n:.0f}"
    t_text = "-" if t is None else f"{t:.0f} s"
    header = (
        f"{'arm':<18} {'seeds':>5}  {'completed @ ' + n_text + ' samples':<24} "
        f"{'exact @ ' + n_text + ' samples':<24} {metric + ' @ ' + t_text:<24} "
        f"{'time to ' + metric + ' >= ' + f'{target:g}':<30} {'projected ceiling':<24} "
        f"{'groups (dropped) useful':<24} wall s (+setup)"
    )
    lines = [header]
    for arm, row in summary["arms"].items():
        seeds = f"{row['finished']}/{row['seeds']}"
        if not row["finished"]:
            lines.append(f"{arm:<18} {seeds:>5}  (no finished run)")
            continue
        wall = f"{row['wall_s']['median']:.0f}"
        if row["setup_s"]["median"] is not None:
            wall += f" (+{row['setup_s']['median']:.0f})"
        lines.append(
            f"{arm:<18} {seeds:>5}  {_pct(row['final']['completed']):<24} "
            f"{_pct(row['final']['exact']):<24} {_pct(row['at_time'][metric]):<24} "
            f"{_seconds(row['time_to_target'], row['finished']):<30} "
            f"{_pct(row['ceiling']):<24} {_groups(row):<24} {wall}"
        )
    for arm, row in summary["arms"].items():
        for seed, why in row["failed"].items():
            lines.append(f"failed: {arm} seed {seed}: {why}")
    return "\n".join(lines)
