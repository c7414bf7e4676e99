"""``streamrl`` command line. Parses and validates config before importing torch or ray."""

from __future__ import annotations

import argparse
import sys

from streamrl.config import ConfigError, load_config


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamrl", description="Asynchronous streaming RL trainer for LLM post-training."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    launch = sub.add_parser("launch", help="run a training job")
    launch.add_argument("config", nargs="?", help="YAML config (default: configs/default.yaml)")
    launch.add_argument("overrides", nargs="*", help="section.key=value overrides")
    launch.add_argument("--learners", type=int, help="learner ranks (learner.count)")
    launch.add_argument("--generators", type=int, help="generator actors (generator.count)")
    launch.add_argument("--mode", choices=["async", "sync"], help="run.mode")
    launch.add_argument("--name", help="run name (run.name): the run directory is runs/NAME")
    launch.add_argument("--address", help="join an existing Ray cluster (HOST:PORT or auto)")

    validate = sub.add_parser("validate", help="check a config and print it resolved")
    validate.add_argument("config")
    validate.add_argument("overrides", nargs="*")

    buffer = sub.add_parser("buffer", help="replay buffer tools")
    buffer_sub = buffer.add_subparsers(dest="buffer_command", required=True)
    export = buffer_sub.add_parser("export", help="write every logged trajectory to Parquet")
    export.add_argument("run_dir")
    export.add_argument("out")
    return parser


def _default_config() -> str | None:
    from pathlib import Path

    path = Path("configs/default.yaml")
    return str(path) if path.is_file() else None


def _split_config_arg(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    # `streamrl launch learner.lr=1e-4` has no config file: the first positional is an override.
    overrides = list(args.overrides)
    path = args.config
    if path is not None and "=" in path and not path.endswith((".yaml", ".yml")):
        overrides.insert(0, path)
        path = None
    return path, overrides


def _launch(args: argparse.Namespace) -> int:
    path, overrides = _split_config_arg(args)
    path = path or _default_config()
    for flag, key in (
        ("learners", "learner.count"),
        ("generators", "generator.count"),
        ("mode", "run.mode"),
        ("name", "run.name"),
    ):
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={value}")
    config = load_config(path, overrides)
    from streamrl.data import DataError
    from streamrl.launch import RunError, launch
    from streamrl.models import ModelNotFoundError

    try:
        summary = launch(config, address=args.address)
    except (RunError, DataError, ModelNotFoundError) as exc:
        print(f"streamrl: {exc}", file=sys.stderr)
        return 1
    print(f"done: version {summary['version']}, run directory {summary['run_dir']}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    from streamrl.config import to_yaml
    from streamrl.rewards import check_rewards

    config = load_config(args.config, args.overrides)
    check_rewards(config.rewards)
    print(to_yaml(config), end="")
    return 0


def _buffer_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from streamrl.buffers.export import export_parquet

    try:
        rows = export_parquet(Path(args.run_dir), Path(args.out))
    except FileNotFoundError as exc:
        print(f"streamrl: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {rows} trajectories to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handlers = {"launch": _launch, "validate": _validate}
    try:
        if args.command == "buffer":
            return _buffer_export(args)
        return handlers[args.command](args)
    except ConfigError as exc:
        print(f"streamrl: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
