"""The machine a benchmark ran on, and ``report.md`` and PNGs from ``bench throughput``."""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    """What to quote next to every figure: CPU model and capability, cores, torch, GPU, date."""
    import torch

    from streamrl.hardware import cpu_description

    info: dict[str, Any] = {
        "cpu": cpu_description(),
        "cores": len(os.sched_getaffinity(0)),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
    }
    if torch.cuda.is_available():
        info["gpu"] = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return info


def mode_label(result: dict[str, Any]) -> str:
    """``sync (split)``, ``sync (colocated)`` or ``async η=2``: how a benchmarked mode is
    named in tables and plots (streamrl.bench.throughput: the two synchronous baselines)."""
    if result["mode"] == "async":
        return f"async η={result['eta']}"
    return "sync (colocated)" if result["mode"] == "sync-colocated" else "sync (split)"


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def markdown(results: list[dict[str, Any]], comparison: dict[str, Any], meta: dict) -> str:
    """``report.md``: the machine, one table row per mode, and the comparison with the ideal."""
    m = meta["machine"]
    lines = [
        f"# streamrl bench throughput: {meta['config']}",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}"
        + (f", {m['gpu']}" if "gpu" in m else "")
        + f"; {m['date']}. Placement: {meta['placement']}.",
        f"Window: {meta['steps']} steps after a warm-up of {meta['warmup']}; buffer level "
        "(groups) at its opening / mean over it: "
        + ", ".join(
            f"{mode_label(r)} {r['buffer_at_open']:.0f} / {r['buffer_mean']:.1f}" for r in results
        )
        + ".",
        "",
        "| mode | samples/s | trained tok/s | generated tok/s (useful) | generator busy | "
        "waits admission | waits weights | weight pauses | publish->applied median / max | "
        "learner busy | staleness mean | "
        "staleness histogram | weight bytes/step | length mean / longest per step (turns) | "
        "window s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        hist = ", ".join(f"{k}: {v:.0f}" for k, v in sorted(r["staleness_histogram"].items()))
        lines.append(
            f"| {mode_label(r)} | {r['samples_per_s']:.2f} | {r['trained_tokens_per_s']:.1f} | "
            f"{r['generated_tokens_per_s']:.1f} ({_pct(r.get('useful_generation', 0.0))}) | "
            f"{_pct(r['generator_busy'])} | "
            f"{_pct(r['generator_wait_admission'])} | {_pct(r['generator_wait_weights'])} | "
            f"{_pct(r['generator_weights_pause'])} | "
            f"{r.get('publish_to_applied_median_s', 0.0):.2f} / "
            f"{r.get('publish_to_applied_max_s', 0.0):.2f} s | {_pct(r['learner_busy'])} | "
            f"{r['staleness_mean']:.2f} | {hist} | {r['weight_bytes_per_step']:.3g} | "
            f"{_lengths(r)} | {r['window_s']:.0f} |"
        )
    c = comparison
    colocated = "ideal_colocated" in c
    lines += [
        "",
        "Baselines: sync (split) runs on the async placement, each phase on its own cores "
        "while the other's idle; sync (colocated) gives each phase every core, as a "
        "colocated synchronous trainer does (the stronger one, where it ran).",
        "",
        f"Measured alone (split sync run): T_gen {c['t_gen_s']:.2f} s and T_train "
        f"{c['t_train_s']:.2f} s per step; ideal async/sync "
        f"(T_gen + T_train) / max = {c['ideal']:.2f}x."
        + (
            f" Colocated: T_gen {c['t_gen_colocated_s']:.2f} s and T_train "
            f"{c['t_train_colocated_s']:.2f} s per step on every core; ideal async/colocated "
            f"{c['ideal_colocated']:.2f}x."
            if colocated
            else ""
        ),
        "",
        "| η | async/split sync | efficiency (÷ ideal) | target ≥ 0.9 | "
        + ("async/colocated sync | efficiency (÷ ideal) | " if colocated else "")
        + "pacing role busy | target ≥ 90% |",
        "|---|---|---|---|" + ("---|---|" if colocated else "") + "---|---|",
    ]
    for row in c["async"]:
        pacing = row.get("pacing_busy", row["generator_busy"])
        against = (
            f"{row['async_over_colocated']:.2f}x | {row['efficiency_colocated']:.2f} | "
            if "async_over_colocated" in row
            else ""
        )
        lines.append(
            f"| {row['eta']} | {row['async_over_sync']:.2f}x | {row['efficiency']:.2f} | "
            f"{'met' if row['efficiency'] >= 0.9 else 'missed'} | {against}"
            f"{row.get('pacing_role', 'generators')} {_pct(pacing)} "
            f"| {'met' if pacing >= 0.9 else 'missed'} |"
        )
    lines += stage_table(results)
    roles = [(r, label, f) for r in results for label, f in r.get("reward_roles", {}).items()]
    if roles:
        lines += [
            "",
            "Reward roles (docs/design.md §7c), over each window:",
            "",
            "| mode | reward role | busy | queue wait mean | latency p95 | requests |",
            "|---|---|---|---|---|---|",
        ]
        for r, label, f in roles:
            lines.append(
                f"| {mode_label(r)} | {label} | {_pct(f['busy_fraction'])} | "
                f"{1000 * f['queue_wait_mean_s']:.0f} ms | {1000 * f['latency_p95_s']:.0f} ms | "
                f"{f['requests']:.0f} |"
            )
    return "\n".join(lines) + "\n"


def stage_table(results: list[dict[str, Any]]) -> list[str]:
    """Publish -> applied by stage (docs/design.md §4), median / max seconds over each window,
    so that a slower weight path names its stage."""
    stages = list(dict.fromkeys(s for r in results for s in r.get("weight_stages", {})))
    if not stages:
        return []
    lines = [
        "",
        "Weight path by stage, median / max s over the window: the learner's snapshot, "
        "encode and send of a version; then, on the slowest generator, publish -> its last "
        "chunk in (arrive), -> the weight thread on it (queue), decoded into the image and "
        "verified (apply), the engine's copies made (prepare), -> adopted between decode "
        "steps (adopt).",
        "",
        "| mode | " + " | ".join(stages) + " | publish->applied |",
        "|---|" + "---|" * (len(stages) + 1),
    ]
    for r in results:
        figures = r.get("weight_stages", {})
        cells = [
            f"{figures[s][0]:.3f} / {figures[s][1]:.3f}" if s in figures else "-" for s in stages
        ]
        lines.append(
            f"| {mode_label(r)} | "
            + " | ".join(cells)
            + f" | {r.get('publish_to_applied_median_s', 0.0):.3f} / "
            f"{r.get('publish_to_applied_max_s', 0.0):.3f} |"
        )
    return lines


def plots(results: list[dict[str, Any]], out: Path) -> list[Path]:
    """throughput.png (samples/s per mode), utilisation.png (busy fractions over time),
    reward.png (batch reward against wall time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [mode_label(r) for r in results]
    paths = []
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.bar(labels, [r["samples_per_s"] for r in results], color="tab:blue")
    ax.set_ylabel("trained samples / s")
    ax.set_title("throughput (steady-state window)")
    fig.tight_layout()
    paths.append(out / "throughput.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(len(results), 1, figsize=(7, 2.2 * len(results)), squeeze=False)
    for ax, r, label in zip(axes[:, 0], results, labels, strict=True):
        t = [p["t"] for p in r["timeline"]]
        ax.step(t, [p["generator_busy"] for p in r["timeline"]], label="generators", where="pre")
        ax.step(t, [p["learner_busy"] for p in r["timeline"]], label="learner", where="pre")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(label)
    axes[0, 0].legend(loc="lower right")
    axes[0, 0].set_title("busy fraction between learner steps")
    axes[-1, 0].set_xlabel("seconds since the first step")
    fig.tight_layout()
    paths.append(out / "utilisation.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for r, label in zip(results, labels, strict=True):
        ax.plot([p["t"] for p in r["timeline"]], [p["reward"] for p in r["timeline"]], label=label)
    ax.set_xlabel("seconds since the first step")
    ax.set_ylabel("batch reward mean")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "reward.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def _lengths(result: dict) -> str:
    """Trajectory length: mean / mean of each step's longest, in tokens (and turns per
    episode for a multi-turn job); results from before these figures show a dash."""
    if "response_tokens_mean" not in result:
        return "-"
    text = f"{result['response_tokens_mean']:.1f} / {result['response_tokens_max_mean']:.1f}"
    return text + (f" ({result['turns_mean']:.2f})" if result.get("turns_mean") else "")
