"""Learning quality, sync vs async: the same job, the same number of trained samples.

Trains a config (default: the default job) once with ``--mode sync`` and once async, each to
the same ``run.max_steps`` (so the same samples: steps x groups_per_step x group_size), with
held-out evaluation on (``eval.every``). Prints, per mode, held-out exact-match accuracy
before and after and the wall time, and writes ``quality.png``: eval accuracy against trained
samples and against wall-clock time, one line per mode. Asynchrony should reach the same
accuracy at equal samples (within noise) and get there sooner in wall time.

    streamrl bench quality                              # the default job, ~2 x 14 min here
    streamrl bench quality --config configs/tiny.yaml --out /tmp/q run.max_steps=6
    python benchmarks/quality.py ...                    # the same
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from streamrl.config import default_config_path, load_config


def run_mode(mode: str, args: argparse.Namespace) -> dict:
    """Run the job in ``mode`` with ``streamrl launch`` (its console goes to
    ``<out>/quality-<mode>.log``); its eval curve as (samples, seconds, exact) points."""
    overrides = [
        f"run.output_dir={args.out}",
        f"run.name=quality-{mode}",
        "run.overwrite=true",
        "logging.progress=false",
        *args.overrides,
    ]
    config = load_config(args.config, [f"run.mode={mode}", *overrides])
    if config.eval.every <= 0:
        raise SystemExit("the config evaluates nothing (eval.every = 0): set eval.every")
    started = time.time()
    with open(args.out / f"quality-{mode}.log", "w") as log:
        command = [sys.executable, "-m", "streamrl.cli", "launch", args.config, "--mode", mode]
        if subprocess.run([*command, *overrides], stdout=log, stderr=log).returncode != 0:
            raise SystemExit(f"the {mode} run failed: see {log.name}")
    run_dir = args.out / f"quality-{mode}"
    summary = json.loads((run_dir / "summary.json").read_text())
    samples_per_step = config.learner.groups_per_step * config.generator.group_size
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    curve = [
        {
            "samples": e["eval/version"] * samples_per_step,
            "seconds": e["time"] - started,
            "exact": e["eval/exact_match"],
            "accuracy": e["eval/accuracy"],
        }
        for e in events
        if e.get("event") == "eval"
    ]
    return {"wall_s": summary["wall_time_s"], "steps": summary["version"], "curve": curve}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_samples, by_time) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for mode, r in results.items():
        xs = [p["samples"] for p in r["curve"]]
        ts = [p["seconds"] for p in r["curve"]]
        ys = [p["exact"] for p in r["curve"]]
        by_samples.plot(xs, ys, marker="o", label=mode)
        by_time.plot(ts, ys, marker="o", label=mode)
    by_samples.set(xlabel="trained samples", ylabel="held-out exact match", title="by samples")
    by_time.set(xlabel="wall-clock seconds", title="by time")
    by_samples.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="streamrl bench quality", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--config", default=default_config_path())
    parser.add_argument("--out", type=Path, default=Path("runs/quality"))
    parser.add_argument("--modes", default="sync,async")
    parser.add_argument("overrides", nargs="*", help="section.key=value for both modes")
    args = parser.parse_args(argv)
    if args.config is None:
        raise SystemExit("no --config given and no configs/default.yaml here")
    args.out.mkdir(parents=True, exist_ok=True)
    results = {mode: run_mode(mode, args) for mode in args.modes.split(",")}
    from streamrl.hardware import cpu_description

    print(f"# quality: {args.config} {' '.join(args.overrides)}; {cpu_description()}")
    print(f"{'mode':<6} {'steps':>5} {'exact before':>13} {'exact after':>12} {'wall s':>8}")
    for mode, r in results.items():
        first, last = r["curve"][0], r["curve"][-1]
        print(
            f"{mode:<6} {r['steps']:>5} {first['exact']:>13.3f} {last['exact']:>12.3f} "
            f"{r['wall_s']:>8.0f}"
        )
    (args.out / "quality.json").write_text(json.dumps(results, indent=1))
    plot(results, args.out / "quality.png")
    print(f"wrote {args.out / 'quality.json'} and {args.out / 'quality.png'}")


if __name__ == "__main__":
    main()
