"""``streamrl bench throughput|simulate|quality``: the benchmarks a user runs by name."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from streamrl.config import ConfigError, default_config_path
from streamrl.config.overrides import parse_with_overrides


def _etas(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text}"
        ) from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError("staleness values must be integers >= 0")
    return values


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamrl bench", description="Benchmarks: throughput, simulate, quality."
    )
    sub = parser.add_subparsers(dest="bench", required=True)
    tp = sub.add_parser(
        "throughput",
        help="sync vs async at each staleness bound, steady state, pinned placement",
        description="Runs CONFIG (default: configs/default.yaml) in sync mode and in async "
        "mode at each --staleness, each for --warmup + --steps learner steps, and measures "
        "the steady-state window. Writes results.json, report.md and PNGs to --out.",
    )
    tp.add_argument("config", nargs="?", help="YAML config (default: configs/default.yaml)")
    tp.add_argument("overrides", nargs="*", help="section.key=value overrides for every mode")
    tp.add_argument("--steps", type=int, default=20, help="measured steps per mode (20)")
    tp.add_argument("--warmup", type=int, default=5, help="steps skipped before the window (5)")
    tp.add_argument("--staleness", type=_etas, default=[2], help="async bounds, e.g. 0,1,2,4")
    tp.add_argument("--out", type=Path, default=Path("runs/bench-throughput"))

    sim = sub.add_parser(
        "simulate",
        help="discrete-event SIMULATION of admission, buffer and staleness at scale",
        description="Validates the model against `bench throughput`'s results.json (--from), "
        "then projects sync and async throughput to --gpus generator GPUs with published "
        "per-GPU figures. Every figure it prints is a simulation.",
    )
    sim.add_argument("--from", dest="results", type=Path, help="bench throughput results.json")
    sim.add_argument("--staleness", type=_etas, default=[1, 2, 4])
    sim.add_argument("--steps", type=int, default=30, help="measured steps of the projection")
    sim.add_argument("--warmup", type=int, default=5)
    sim.add_argument("--gpus", type=_etas, default=[8, 64, 512], help="generator GPU counts")
    sim.add_argument("--out", type=Path, help="write simulation.json here")

    sub.add_parser(
        "quality",
        help="held-out accuracy per arm (sync, async at each η, ...) over seeds",
        add_help=False,
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["quality"]:
        from streamrl.bench.quality import main as quality

        return quality(argv[1:])
    parser = _parser()
    args = parse_with_overrides(parser, argv)  # `throughput cfg.yaml --steps 3 a.b=1`
    if args.bench == "throughput":
        from streamrl.bench.throughput import BenchError, bench_throughput

        config, overrides = args.config, list(args.overrides)
        if config is not None and "=" in config and not config.endswith((".yaml", ".yml")):
            config, overrides = None, [config, *overrides]
        try:
            bench_throughput(
                config or default_config_path(),
                overrides,
                steps=args.steps,
                warmup=args.warmup,
                etas=args.staleness,
                out=args.out,
            )
        except (BenchError, ConfigError) as exc:
            print(f"streamrl bench throughput: {exc}", file=sys.stderr)
            return 2
        return 0
    from streamrl.bench.simulate import bench_simulate

    if args.warmup < 1 or args.steps < 2:
        print("streamrl bench simulate: need --warmup >= 1 and --steps >= 2", file=sys.stderr)
        return 2
    try:
        bench_simulate(args.results, args.staleness, args.steps, args.warmup, args.gpus, args.out)
    except (OSError, ValueError, KeyError, StopIteration) as exc:
        print(f"streamrl bench simulate: cannot use {args.results}: {exc!r}", file=sys.stderr)
        return 2
    return 0
