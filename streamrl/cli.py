"""``streamrl`` command line. Parses and validates config before importing torch or ray."""

from __future__ import annotations

import argparse
import sys

from streamrl.config import Override, launch_config
from streamrl.config.overrides import parse_with_overrides


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamrl", description="Asynchronous streaming RL trainer for LLM post-training."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    launch = sub.add_parser("launch", help="run a training job")
    launch.add_argument(
        "config",
        nargs="?",
        help="YAML config, or the name of a shipped job (default: the shipped default.yaml)",
    )
    launch.add_argument("overrides", nargs="*", help="section.key=value overrides")
    launch.add_argument("--learners", type=int, help="learner ranks (learner.count)")
    launch.add_argument("--generators", type=int, help="generator actors (generator.count)")
    launch.add_argument("--mode", choices=["async", "sync"], help="run.mode")
    launch.add_argument("--name", help="run name (run.name): the run directory is runs/NAME")
    launch.add_argument("--address", help="join an existing Ray cluster (HOST:PORT or auto)")
    launch.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue RUN_DIR from its newest checkpoint with its config (plus overrides)",
    )
    launch.add_argument("--gpus-per-generator", type=float, help="generator.gpus")
    launch.add_argument("--gpus-per-learner", type=float, help="learner.gpus")
    launch.add_argument(
        "--gpus-per-reward", type=float, help="GPUs per reward role (scoring.gpus_per_role)"
    )

    validate = sub.add_parser(
        "validate", help="check a config (the default job's when none) and print it resolved"
    )
    validate.add_argument("config", nargs="?", help="a YAML file or a job's name")
    validate.add_argument("overrides", nargs="*")

    buffer = sub.add_parser("buffer", help="replay buffer tools")
    buffer_sub = buffer.add_subparsers(dest="buffer_command", required=True)
    export = buffer_sub.add_parser("export", help="write every logged trajectory to Parquet")
    export.add_argument("run_dir")
    export.add_argument("out")

    evaluate = sub.add_parser(
        "eval",
        help="score a model on held-out prompts",
        description="Greedy held-out evaluation (the run's eval settings and verifiers for a "
        "run directory; for --data <task> that task's shipped job; the default job's "
        "otherwise); prints a table and writes JSON.",
    )
    evaluate.add_argument(
        "models",
        nargs="+",
        metavar="MODEL_OR_RUN",
        help="an HF directory, a run directory (its hf/) or a built-in name",
    )
    evaluate.add_argument(
        "--data",
        help="eval.source: a built-in task (arithmetic, chain, countdown, gsm) or a "
        ".parquet/.jsonl file",
    )
    evaluate.add_argument("--max-prompts", type=int, help="eval.max_prompts")
    evaluate.add_argument("--device", default="cpu", help="cpu or cuda")
    evaluate.add_argument("--out", default="eval.json", help="JSON with figures and responses")

    export_model = sub.add_parser("export", help="a run's checkpoint -> an HF model directory")
    export_model.add_argument("run_dir")
    export_model.add_argument("--step", type=int, help="checkpoint version (default: newest)")
    export_model.add_argument("--out", required=True, help="output directory")
    export_model.add_argument(
        "--merge", action="store_true", help="LoRA runs: the base with the adapters merged in"
    )

    replay = sub.add_parser(
        "replay",
        help="retrain a run's learner from its training record: bitwise, or with --set changes",
        description="Replays every recorded step (or up to --until) and checks that the weights "
        "equal the run's after each; exits 1 naming the first step that differs. With --set, "
        "also trains a counterfactual arm on the same batches and writes its figures under "
        "RUN_DIR/replays/.",
    )
    replay.add_argument("run_dir")
    replay.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config change for the counterfactual arm (repeatable)",
    )
    replay.add_argument("--until", type=int, help="the last step to replay")
    replay.add_argument(
        "--from-checkpoint", type=int, help="start from the run's checkpoint of this version"
    )
    replay.add_argument(
        "--eval-at",
        default="",
        metavar="STEPS",
        help="held-out accuracy of every arm after these steps, e.g. 0,20,40 (0: before)",
    )
    replay.add_argument(
        "--compare", action="store_true", help="print the arms replayed so far, side by side"
    )

    answers = sub.add_parser(
        "answers",
        help="what the model answered: the held-out responses each evaluation kept",
        description="Prints RUN_DIR/answers.jsonl (eval.keep_answers) by prompt and version.",
    )
    answers.add_argument("run_dir")
    answers.add_argument("--prompt", help="only this held-out prompt id")
    answers.add_argument("--version", type=int, help="only this version's evaluation")

    # Listed for --help only: main() hands `bench ...` to streamrl.bench.cli's own parser.
    bench = sub.add_parser(
        "bench",
        help="benchmarks: throughput (sync vs async), simulate (at scale), quality",
        add_help=False,
    )
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)

    _add_admin_parser(sub)
    _add_rm_parser(sub)
    return parser


def _add_rm_parser(sub: argparse._SubParsersAction) -> None:
    rm = sub.add_parser("rm", help="reward models: train one on preference pairs, pairs from a run")
    rm_sub = rm.add_subparsers(dest="rm_command", required=True)
    train = rm_sub.add_parser(
        "train",
        help="train a sequence-classification reward model (Bradley-Terry) on pairs",
        description="Train a one-score reward model from a base model on preference pairs "
        "(Bradley-Terry loss); prints the held-out pairwise accuracy before and after and "
        "writes an HF directory that `rewards: - model: DIR` serves.",
    )
    train.add_argument(
        "pairs",
        nargs="+",
        help='JSONL, one {"prompt", "chosen", "rejected"} a line; several files train as one '
        "(a pair in two is kept once)",
    )
    train.add_argument(
        "--model", required=True, help="base: a built-in name, an HF directory, a .gguf or a hub id"
    )
    train.add_argument("--out", required=True, help="the reward model's directory")
    train.add_argument("--epochs", type=int, default=1)
    train.add_argument("--lr", type=float, default=1e-5)
    train.add_argument("--batch-size", type=int, default=8, help="pairs per step")
    train.add_argument("--held-out", type=float, default=0.1, help="share of pairs held out")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--max-tokens", type=int, default=512, help="tokens per text (its last)")
    train.add_argument("--device", default="cpu", help="cpu or cuda")
    train.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    pairs = rm_sub.add_parser(
        "pairs",
        help="preference pairs from a run's logged responses, ranked by a rule reward",
        description="Score every logged response of RUN_DIR with a rule reward and pair, "
        "within each group, a higher-scored response (chosen) with a lower one (rejected). "
        "The durable log keeps consumed groups until it compacts: run the source job with "
        "buffer.compact_every_s=0 to keep every group it trained on.",
    )
    pairs.add_argument("run_dir")
    pairs.add_argument("--out", required=True, help="the pairs' JSONL file")
    pairs.add_argument(
        "--reward",
        default="numeric_match",
        help="a rule reward's name, or 'logged': the reward the run trained each response with",
    )
    pairs.add_argument("--max-per-group", type=int, default=4)
    pairs.add_argument("--seed", type=int, default=0)


def _add_admin_parser(sub: argparse._SubParsersAction) -> None:
    run = argparse.ArgumentParser(add_help=False)
    run.add_argument("--run", required=True, metavar="RUN_DIR", help="the run directory")
    admin = sub.add_parser(
        "admin",
        help="inspect and steer a running job",
        description="Talk to a running job's admin endpoint; the URL and token are read from "
        "RUN_DIR/admin.url and RUN_DIR/admin.token.",
    )
    admin_sub = admin.add_subparsers(dest="admin_command", required=True)
    status = admin_sub.add_parser("status", parents=[run], help="version, rates, roles, buffer")
    status.add_argument("--json", action="store_true", help="print the full JSON answer")
    admin_sub.add_parser("config", parents=[run], help="print the resolved config (JSON)")
    set_ = admin_sub.add_parser(
        "set", parents=[run], help="change live keys, all or nothing (e.g. buffer.capacity=128)"
    )
    set_.add_argument("assignments", nargs="+", metavar="KEY=VALUE")
    for action, text in (
        ("pause", "stop admitting new prompt groups"),
        ("resume", "admit new prompt groups again"),
        ("stop", "stop the run gracefully"),
        ("checkpoint", "write a checkpoint now"),
    ):
        admin_sub.add_parser(action, parents=[run], help=text)


def _split_config_arg(args: argparse.Namespace) -> tuple[str | None, list[Override]]:
    # `streamrl launch learner.lr=1e-4` has no config file: the first positional is an override.
    overrides: list[Override] = list(args.overrides)
    path = args.config
    if path is not None and "=" in path and not path.endswith((".yaml", ".yml")):
        overrides.insert(0, path)
        path = None
    return path, overrides


def _launch(args: argparse.Namespace) -> int:
    path, overrides = _split_config_arg(args)
    for flag, key in (
        ("learners", "learner.count"),
        ("generators", "generator.count"),
        ("mode", "run.mode"),
        ("name", "run.name"),
        ("gpus_per_generator", "generator.gpus"),
        ("gpus_per_learner", "learner.gpus"),
        ("gpus_per_reward", "scoring.gpus_per_role"),
    ):
        value = getattr(args, flag)
        if value is not None:
            overrides.append((key, value))  # typed already: taken as it is
    config = launch_config(path, overrides, resume=args.resume)
    from streamrl.controller.preflight import preflight
    from streamrl.controller.run import launch
    from streamrl.controller.rundir import RunError
    from streamrl.data import DataError

    # Bad input fails here in one line (main's), before the run directory exists.
    checked = preflight(config, address=args.address)
    try:
        summary = launch(config, address=args.address, checked=checked)
    except (RunError, DataError) as exc:
        print(f"streamrl: {exc}", file=sys.stderr)
        return 1
    print(f"done: version {summary['version']}, run directory {summary['run_dir']}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    """The config ``launch`` would run, through the launch's own pre-flight (without building
    or downloading weights: ``controller.preflight``); printed resolved."""
    from streamrl.config import to_yaml
    from streamrl.controller.preflight import preflight

    path, overrides = _split_config_arg(args)  # as `launch` reads them
    config = launch_config(path, overrides)
    checked = preflight(config, resolve=False)
    if checked.data_line:
        print(checked.data_line, file=sys.stderr)
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


def _eval(args: argparse.Namespace) -> int:
    from streamrl.evaluation import EvalError
    from streamrl.workers.generation.evaluator import run_cli_eval

    try:
        return run_cli_eval(args.models, args.data, args.max_prompts, args.device, args.out)
    except EvalError as exc:
        print(f"streamrl eval: {exc}", file=sys.stderr)
        return 2


def _export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from streamrl.export import ExportError, export_checkpoint

    try:
        version = export_checkpoint(Path(args.run_dir), args.step, Path(args.out), args.merge)
    except ExportError as exc:
        print(f"streamrl export: {exc}", file=sys.stderr)
        return 2
    print(f"exported version {version} of {args.run_dir} to {args.out}")
    return 0


def _replay(args: argparse.Namespace) -> int:
    from pathlib import Path

    from streamrl.config import parse_overrides
    from streamrl.replay_compare import compare_table

    run_dir = Path(args.run_dir)
    if args.compare:
        print(compare_table(run_dir))
        return 0
    from streamrl.workers.learning.replay import ReplayError, ReplayRequest, replay
    from streamrl.workers.learning.training_record import RecordError

    try:
        eval_at = [int(x) for x in args.eval_at.split(",") if x.strip()]
    except ValueError:
        print(
            f"streamrl replay: --eval-at takes steps (0,20,40), not {args.eval_at!r}",
            file=sys.stderr,
        )
        return 2
    request = ReplayRequest(
        run_dir, parse_overrides(args.assignments), args.until, args.from_checkpoint, eval_at
    )
    try:
        result = replay(request)
    except (ReplayError, RecordError) as exc:
        print(f"streamrl replay: {exc}", file=sys.stderr)
        return 2
    for problem in result.problems:
        print(f"streamrl replay: {problem}", file=sys.stderr)
    span = f"steps {result.replayed[0]}-{result.replayed[-1]}" if result.replayed else "no step"
    if not result.bitwise:
        print(f"replay: step {result.first_mismatch} differs from the run ({span} replayed)")
        return 1
    figures = ", ".join(map(str, result.outputs))
    print(f"replay: {span} bitwise equal to the run; figures in {figures}")
    return 0


def _rm(args: argparse.Namespace) -> int:
    """``streamrl rm train|pairs``: bad input (a missing or malformed file, a model that
    cannot be used, a used --out) is one line on stderr and exit 2."""
    try:
        return _rm_train(args) if args.rm_command == "train" else _rm_pairs(args)
    except (OSError, ValueError) as exc:  # ModelNotFoundError, FileExistsError, bad JSONL
        print(f"streamrl rm {args.rm_command}: {exc}", file=sys.stderr)
        return 2


def _rm_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from transformers.utils import logging as hf_logging

    from streamrl.rewards.model_training import accuracy_text, read_pairs, train_reward_model

    # Several sources train as one: a run's pairs and a later run's, ranked each its own way.
    pairs = list(dict.fromkeys(pair for path in args.pairs for pair in read_pairs(Path(path))))
    hf_logging.set_verbosity_error()  # the new head's load report: printed below in a line
    hf_logging.disable_progress_bar()
    figures = train_reward_model(
        pairs,
        args.model,
        Path(args.out),
        epochs=args.epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        held_out=args.held_out,
        seed=args.seed,
        max_tokens=args.max_tokens,
        device=args.device,
        overwrite=args.overwrite,
        log=lambda line: print(line, flush=True),
    )
    shown = accuracy_text(figures["accuracy_after"])
    print(f"wrote {args.out} in {figures['seconds']:.0f} s: held-out pairwise accuracy {shown}")
    return 0


def _rm_pairs(args: argparse.Namespace) -> int:
    from pathlib import Path

    from streamrl.buffers.log_history import scan_shard, shard_dirs
    from streamrl.rewards.model_training import pairs_from_run, write_pairs

    buffer_dir = Path(args.run_dir) / "buffer"
    shards = shard_dirs(buffer_dir) if buffer_dir.is_dir() else []
    if not shards:
        raise FileNotFoundError(f"no buffer log under {buffer_dir}")
    read = [0]

    def logged():  # every group of every shard, consumed or not, in log order
        for shard in shards:
            for group, _consumed in scan_shard(shard):
                read[0] += 1
                yield group

    pairs = pairs_from_run(Path(args.run_dir), logged(), args.reward, args.max_per_group, args.seed)
    if not pairs:
        print(
            f"streamrl rm pairs: no pairs: no group of the {read[0]} logged had responses "
            f"that {args.reward} scores differently",
            file=sys.stderr,
        )
        return 1
    write_pairs(Path(args.out), pairs)
    print(f"wrote {len(pairs)} pairs from {read[0]} logged groups to {args.out}")
    return 0


def _answers(args: argparse.Namespace) -> int:
    from pathlib import Path

    from streamrl.eval_answers import ANSWERS_FILE, format_answers, read_answers

    run_dir = Path(args.run_dir)
    rows = list(read_answers(run_dir))
    if not rows:
        print(
            f"streamrl answers: {run_dir}: no {ANSWERS_FILE} (no evaluation kept answers: "
            "eval.every or eval.keep_answers is 0, or none has run yet)",
            file=sys.stderr,
        )
        return 2
    lines = format_answers(rows, args.prompt, args.version)
    if not lines:
        print("streamrl answers: no kept answer matches", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


def _admin(args: argparse.Namespace) -> int:
    import json

    # Stdlib-only client: `streamrl admin` never imports fastapi, torch or ray.
    from streamrl.admin.client import AdminClient, AdminError, format_changes, format_status
    from streamrl.config import parse_overrides

    command = args.admin_command
    try:
        client = AdminClient.from_run_dir(args.run)
        if command == "status":
            answer = client.status()
            print(json.dumps(answer, indent=2) if args.json else format_status(answer))
        elif command == "config":
            print(json.dumps(client.config(), indent=2))
        elif command == "set":
            changes = dict(parse_overrides(args.assignments))
            print(format_changes(client.set(changes)))
        else:
            answer = client.action(command)
            extra = {k: v for k, v in answer.items() if k != "ok"}
            print(f"{command}: ok" + (f" {json.dumps(extra)}" if extra else ""))
    except AdminError as exc:
        print(f"streamrl admin {command}: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # its own parser: flags after `bench` are not streamrl's
        from streamrl.bench.cli import main as bench

        return bench(argv[1:])
    args = parse_with_overrides(parser, argv)
    handlers = {
        "launch": _launch,
        "validate": _validate,
        "admin": _admin,
        "eval": _eval,
        "export": _export,
        "rm": _rm,
        "replay": _replay,
        "answers": _answers,
    }
    from streamrl.controller.preflight import BAD_INPUT
    from streamrl.controller.rundir import RunError

    try:
        if args.command == "buffer":
            return _buffer_export(args)
        return handlers[args.command](args)
    except BAD_INPUT as exc:  # a config, data, model or reward that cannot run
        print(f"streamrl: {exc}", file=sys.stderr)
        return 2
    except RunError as exc:  # a port or run directory taken, a resume on other data
        print(f"streamrl: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
