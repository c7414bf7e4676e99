"""Learning quality per arm over seeds: ``streamrl bench quality``.

Is asynchrony worth its staleness? Each arm trains the same job (default: the default job)
to the same ``run.max_steps``, once per seed, with held-out evaluation on:

- ``sync``; ``async-eta1``, ``async-eta2``, ``async-eta4`` (η = ``buffer.max_staleness``,
  the config's off-policy correction); ``async-eta1-nocorr`` (no correction): the default five;
- ``async-eta1-nodrop``: dynamic sampling's refill off, to compare with peers that lack it;
- ``trl`` (``--peer trl``): TRL's GRPOTrainer on the same recipe (``benchmarks/trl_peer.py``
  in ``.venv-trl``, made by ``scripts/trl_venv.sh``).

Per run: the eval curve (exact; completed = right answer and a natural stop; reward) against
trained samples and wall seconds (on the training clock: from the before-training eval, as
the peer counts from ``trainer.train()``; setup apart), the raw train reward, and the time to
reach ``--target`` on ``--metric``. Per arm: median [min-max] over seeds at equal samples
and at equal wall time (``quality_stats``). Writes ``results.json``, ``quality_by_samples.png`` and
``quality_by_time.png`` to ``--out`` and prints a table with the CPU it ran on.

Each finished (arm, seed) is kept in ``<out>/<arm>/seed-<s>/result.json``: a rerun skips
those and restarts the rest, so a long bench survives interruption. ``--background`` detaches
(log in ``<out>/bench.log``, pid in ``<out>/bench.pid``); ``--report`` re-aggregates what is
there, also while a bench runs.

    streamrl bench quality --background                 # the default job: 5 arms x 3 seeds
    streamrl bench quality --report                     # the table and plots so far
    streamrl bench quality --config configs/tiny.yaml --seeds 0,1 --arms sync,async-eta1 \\
        --out /tmp/q run.max_steps=4 eval.every=2
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from streamrl.bench.quality_runs import (
    ARMS,
    DEFAULT_ARMS,
    PEER_ARMS,
    TRL_PYTHON,
    QualityError,
    check_config,
    run_one,
    stored,
)
from streamrl.bench.quality_stats import aggregate, table
from streamrl.config import ConfigError, default_config_path

BENCH_KEYS = ("run.seed", "run.output_dir", "run.name", "run.mode")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamrl bench quality",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", help="YAML config (default: the default job)")
    parser.add_argument("--out", type=Path, default=Path("runs/quality"), help="(runs/quality)")
    parser.add_argument("--arms", help=f"comma-separated, of {', '.join([*ARMS, *PEER_ARMS])}")
    parser.add_argument("--seeds", help="comma-separated run.seed values (default 0,1,2)")
    parser.add_argument("--target", type=float, help="held-out accuracy to reach (0.3)")
    parser.add_argument("--metric", choices=["completed", "exact"], help="(completed)")
    parser.add_argument("--peer", choices=list(PEER_ARMS), help="add a peer's arm")
    parser.add_argument("--teacher", help="the distillation arms' teacher (a model or a run)")
    parser.add_argument(
        "--keep-weights", action="store_true", help="keep each run's checkpoint and hf export"
    )
    parser.add_argument("--background", action="store_true", help="detach; log to bench.log")
    parser.add_argument("--report", action="store_true", help="only aggregate and plot")
    parser.add_argument("overrides", nargs="*", help="section.key=value for every arm")
    return parser


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise QualityError(f"--seeds: not a comma-separated list of integers: {text}") from None
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise QualityError(f"--seeds: need distinct integers >= 0, got {text}")
    return seeds


def plan(args: argparse.Namespace, stored_meta: dict[str, Any]) -> dict[str, Any]:
    """What this bench runs: the command line's choices, else those of the bench already in
    ``--out`` (so a bare rerun or ``--report`` continues it), else the defaults."""
    arms = args.arms.split(",") if args.arms else stored_meta.get("arms", list(DEFAULT_ARMS))
    if args.peer and args.peer not in arms:
        arms = [*arms, args.peer]
    for arm in arms:
        if arm not in ARMS and arm not in PEER_ARMS:
            known = ", ".join([*ARMS, *PEER_ARMS])
            raise QualityError(f"unknown arm {arm!r}: choose from {known}")
    for item in args.overrides:
        if item.split("=", 1)[0] in BENCH_KEYS:
            raise QualityError(f"{item}: the bench sets it (use --seeds, --out and --arms)")
    config = args.config or stored_meta.get("config") or default_config_path()
    if config is None:
        raise QualityError("no --config given and no default job installed")
    if Path(config).is_file():  # one spelling, whatever directory the bench is run from
        config = Path(config).resolve()
    return {
        "config": str(config),
        "overrides": list(args.overrides) or stored_meta.get("overrides", []),
        "arms": arms,
        "seeds": _seeds(args.seeds) if args.seeds else stored_meta.get("seeds", [0, 1, 2]),
        "target": args.target if args.target is not None else stored_meta.get("target", 0.3),
        "metric": args.metric or stored_meta.get("metric", "completed"),
        "teacher": args.teacher or stored_meta.get("teacher", ""),
        "keep_weights": args.keep_weights,
    }


def _check_same_job(meta: dict[str, Any], stored_meta: dict[str, Any]) -> None:
    """Results of another config or other overrides must not mix with this bench's."""
    for key in ("config", "overrides"):
        if stored_meta and stored_meta.get(key) != meta[key]:
            raise QualityError(
                f"{key} {meta[key]!r} differs from {stored_meta.get(key)!r}, the bench already "
                "in --out: use another --out, or the same config and overrides"
            )


def _running(out: Path) -> int | None:
    """The pid of a bench still running in ``out``, if any."""
    try:
        pid = int((out / "bench.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid if pid != os.getpid() else None


def collect(out: Path, meta: dict[str, Any]) -> dict[str, dict[int, dict | None]]:
    """Every planned (arm, seed): its stored result, failure, or None (not run yet)."""
    return {arm: {seed: stored(out, arm, seed) for seed in meta["seeds"]} for arm in meta["arms"]}


def report(out: Path, meta: dict[str, Any], console: Any = None) -> dict[str, Any]:
    """Aggregate what is in ``out``; write results.json and the PNGs; print the table."""
    console = sys.stdout if console is None else console
    from streamrl.bench.quality_figures import plots
    from streamrl.bench.report import machine

    results = collect(out, meta)
    summary = aggregate(results, meta["metric"], meta["target"])
    here = machine()
    import torch

    here["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    runs = [r for by_seed in results.values() for r in by_seed.values() if r is not None]
    run_cpus = sorted({r["cpu"] for r in runs if "cpu" in r})
    meta_out = {**meta, "machine": here, "run_cpus": run_cpus}
    document = {"meta": meta_out, "summary": summary, "runs": results}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(document, indent=1))
    extra = " ".join(meta["overrides"])
    print(f"# bench quality: {meta['config']} {extra}".rstrip(), file=console)
    print(
        f"# CPU: {here['cpu']}; torch.backends.cpu.get_cpu_capability() {here['cpu_capability']}",
        file=console,
    )
    if run_cpus and run_cpus != [here["cpu"]]:
        print(f"# runs made on: {'; '.join(run_cpus)}", file=console)
    print(table(summary, meta["metric"], meta["target"]), file=console)
    try:
        paths = plots(summary, out, meta["metric"], meta["target"])
    except ImportError:
        paths = []
        print("matplotlib is not installed: no PNGs", file=console)
    written = ", ".join(p.name for p in [out / "results.json", *paths])
    print(f"wrote {written} in {out}", file=console, flush=True)
    return document


def bench(out: Path, meta: dict[str, Any], console: Any = None) -> dict[str, Any]:
    """Run every unfinished (arm, seed), seeds outermost so each arm has a seed early;
    aggregate after each run, so results.json is current while the bench goes on."""
    console = sys.stdout if console is None else console
    (out / "bench.pid").write_text(str(os.getpid()))
    try:
        for seed in meta["seeds"]:
            for arm in meta["arms"]:
                done = stored(out, arm, seed)
                if done is not None and "failed" not in done:
                    print(f"{arm} seed {seed}: finished earlier, kept", file=console, flush=True)
                    continue
                print(f"{arm} seed {seed}: running", file=console, flush=True)
                try:
                    result = run_one(
                        meta["config"],
                        arm,
                        seed,
                        out,
                        meta["overrides"],
                        meta["keep_weights"],
                        meta.get("teacher", ""),
                    )
                except QualityError as exc:
                    print(f"{arm} seed {seed}: FAILED: {exc}", file=console, flush=True)
                    continue
                last = result["curve"][-1]
                print(
                    f"{arm} seed {seed}: trained in {result['wall_s']:.0f} s, final completed "
                    f"{last['completed']:.3f}, exact {last['exact']:.3f}",
                    file=console,
                    flush=True,
                )
                report(out, meta, console=io.StringIO())
        return report(out, meta, console)
    finally:
        (out / "bench.pid").unlink(missing_ok=True)


def background(argv: list[str], out: Path) -> int:
    """Start this same bench detached from the terminal (its own session) and return."""
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "streamrl.bench.quality", *argv]
    with open(out / "bench.log", "w") as log:
        child = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    (out / "bench.pid").write_text(str(child.pid))
    print(
        f"bench quality running in the background (pid {child.pid}): tail -f {out}/bench.log; "
        f"the table so far: streamrl bench quality --out {out} --report; to stop it and its "
        f"run: kill -- -{child.pid}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """``streamrl bench quality``; 2 and one line on stderr for input it cannot run."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_intermixed_args(argv)
    out: Path = args.out
    try:
        stored_meta = json.loads((out / "bench.json").read_text())
    except (OSError, ValueError):
        stored_meta = {}
    try:
        meta = plan(args, stored_meta)
        if args.report:
            report(out, meta)
            return 0
        _check_same_job(meta, stored_meta)
        for arm in meta["arms"]:
            check_config(meta["config"], arm, meta["overrides"], out, meta["teacher"])
        if "trl" in meta["arms"] and not TRL_PYTHON.exists():
            raise QualityError(f"--peer trl needs {TRL_PYTHON}: run ./scripts/trl_venv.sh first")
        pid = _running(out)
        if pid is not None:
            raise QualityError(
                f"a bench is already running in {out} (pid {pid}; if it is not, remove "
                f"{out / 'bench.pid'})"
            )
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.json").write_text(json.dumps(meta, indent=1))
        if args.background:
            return background([a for a in argv if a != "--background"], out)
        bench(out, meta)
    except (QualityError, ConfigError) as exc:
        print(f"streamrl bench quality: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
