"""One (arm, seed) of ``streamrl bench quality``: what each arm changes, how it is run, and
the per-run result every arm shares (streamrl's and the TRL peer's alike, so one code path
aggregates them all).

A run's result (``<out>/<arm>/seed-<s>/result.json``, written only once the run has
finished, which is what makes a rerun skip it)::

    {"wall_s": float, "steps": int,
     "curve": [{"samples", "seconds", "exact", "completed", "reward_mean"}, ...],
     "train_reward": [[samples, reward], ...], "arm": str, "seed": int, "cpu": str, ...}

``seconds`` and ``wall_s`` count on the training clock, as the TRL peer does: from the start
of the before-training eval (streamrl) or of ``trainer.train()`` (TRL), held-out evals
included; process start, model load and setup come before it and are kept as ``setup_s``
(streamrl's is mostly Ray and its role processes starting, a constant that would otherwise
blur the comparison of learning speed). A run that fails leaves ``failed.json`` (one line
of why) instead; a rerun tries it again.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from streamrl.clock import live_records
from streamrl.config import Config, load_config

ROOT = Path(__file__).resolve().parents[2]
TRL_PYTHON = ROOT / ".venv-trl" / "bin" / "python"
TRL_SCRIPT = ROOT / "benchmarks" / "trl_peer.py"
PEER_ARMS = ("trl",)

# Where a distillation arm's keys name the teacher (``--teacher``).
TEACHER = "<teacher>"
# Each arm's own keys. η is buffer.max_staleness; the async arms keep the config's default
# off-policy correction unless they say otherwise.
ARMS: dict[str, list[str]] = {
    # The colocated synchronous baseline: nothing pinned (placement.pin_cpus is off unless the
    # config sets it), each phase on every core while the other waits (streamrl.cores).
    "sync": ["run.mode=sync"],
    "async-eta1": ["run.mode=async", "buffer.max_staleness=1"],
    "async-eta2": ["run.mode=async", "buffer.max_staleness=2"],
    "async-eta4": ["run.mode=async", "buffer.max_staleness=4"],
    "async-eta1-nocorr": [
        "run.mode=async",
        "buffer.max_staleness=1",
        "algorithm.correction=none",
        "algorithm.allow_uncorrected=true",
    ],
    # The difficulty sampler (controller/difficulty.py) against async-eta1's uniform draw.
    "async-eta1-difficulty": [
        "run.mode=async",
        "buffer.max_staleness=1",
        "data.sampler=difficulty",
    ],
    # Probe sampling (workers/generation/probing.py): each group's prompt the least likely of
    # three probes'; slower than uniform on the HF engine (docs/experiments.md, 2026-12-04,
    # session 6).
    "async-eta1-probe": [
        "run.mode=async",
        "buffer.max_staleness=1",
        "generator.probe_candidates=3",
    ],
    # Screening (workers/generation/screening.py): each group's first half decides whether
    # it gets its second (4 of 8; the config must drop flat groups). The default job screens
    # already (`auto`); its arm without is the next one.
    "async-eta1-screen": [
        "run.mode=async",
        "buffer.max_staleness=1",
        "generator.screen_samples=4",
    ],
    "async-eta1-noscreen": [
        "run.mode=async",
        "buffer.max_staleness=1",
        "generator.screen_samples=0",
    ],
    # LoRA (r = 16 on every linear layer) against async-eta1's full fine-tuning, same recipe
    # but the learning rate: 5e-4 of 2e-4, 5e-4 and 1e-3 held out most on seed 0 (53.1%,
    # 56.2%, 46.1%; docs/experiments.md, 2026-11-27).
    "async-eta1-lora": [
        "run.mode=async",
        "buffer.max_staleness=1",
        "model.lora={r: 16, alpha: 32, target_modules: all-linear}",
        "learner.lr=5e-4",
    ],
    # Dynamic sampling's refill off: what a peer without it (TRL's GRPOTrainer) trains on.
    "async-eta1-nodrop": [
        "run.mode=async",
        "buffer.max_staleness=1",
        "buffer.drop_zero_variance=false",
    ],
    # On-policy distillation from ``--teacher`` (docs/design.md §7d): the forward KL over
    # its top-8 (configs/distill.yaml's, its target sharpened; alone, eight questions of
    # two samples a step and two versions of lag as there), or beside the config's rewards.
    "distill": [
        "run.mode=async",
        "buffer.max_staleness=2",
        "generator.group_size=2",
        "generator.prompts_per_call=8",
        "learner.groups_per_step=8",
        f"rewards=[{{teacher: {{model: '{TEACHER}', top_k: 8, sampled_kl: false, "
        "target_tau: 0.5}}]",
    ],
    "rl-distill": [
        "run.mode=async",
        "buffer.max_staleness=1",
        f"rewards+=[{{teacher: {{model: '{TEACHER}', top_k: 8, sampled_kl: false}}}}]",
    ],
    # The config's rewards beside a lagged copy of the student (self-distillation, refreshed
    # every 5 versions): no --teacher needed.
    "rl-self": [
        "run.mode=async",
        "buffer.max_staleness=1",
        "rewards+=[{teacher: {model: self, refresh_every: 5}, weight: 0.5}]",
    ],
}
DEFAULT_ARMS = ["sync", "async-eta1", "async-eta2", "async-eta4", "async-eta1-nocorr"]
CURVE_KEYS = ("samples", "seconds", "exact", "completed", "reward_mean")


class QualityError(RuntimeError):
    """A bench that cannot run, or one run that failed; the message is one line."""


def run_dir(out: Path, arm: str, seed: int) -> Path:
    """Where one (arm, seed) keeps its result, log and the run itself."""
    return out / arm / f"seed-{seed}"


def arm_keys(arm: str, teacher: str = "") -> list[str]:
    """An arm's own keys, a distillation arm's with its teacher filled in."""
    if arm not in ARMS:
        raise QualityError(f"unknown arm {arm!r}: choose from {', '.join([*ARMS, *PEER_ARMS])}")
    keys = ARMS[arm]
    if any(TEACHER in key for key in keys):
        if not teacher:
            raise QualityError(f"arm {arm} distils: name its teacher with --teacher MODEL")
        keys = [key.replace(TEACHER, teacher) for key in keys]
    return keys


def arm_overrides(arm: str, seed: int, out: Path, user: list[str], teacher: str = "") -> list[str]:
    """The overrides of one streamrl run: the user's first, then the arm's keys and the
    bench's own (seed, run directory), which win, so an arm is always what its name says."""
    keys = arm_keys(arm, teacher)
    where = run_dir(out, arm, seed)
    return [
        *user,
        *keys,
        f"run.seed={seed}",
        f"run.output_dir={where}",
        "run.name=run",
        "run.overwrite=true",  # an unfinished run left by an earlier bench starts again
        "logging.progress=false",
    ]


def check_config(
    config_path: str, arm: str, user: list[str], out: Path, teacher: str = ""
) -> Config:
    """Load the config as the arm would run it, so a bad override or a config that
    evaluates nothing stops the bench before hours of runs, not after."""
    keys = ARMS["sync"] if arm in PEER_ARMS else arm_keys(arm, teacher)
    config = load_config(config_path, [*user, *keys])
    if config.eval.every <= 0:
        raise QualityError(
            "the config evaluates nothing during the run (eval.every = 0): set eval.every, "
            "e.g. eval.every=10"
        )
    return config


def load_result(path: Path) -> dict[str, Any]:
    """A stored per-run result, checked for the shared shape (a peer may write it)."""
    try:
        result = json.loads(path.read_text())
        curve = result["curve"]
        float(result["wall_s"])
        int(result["steps"])
        for point in curve:
            for key in CURVE_KEYS:
                float(point[key])
        for samples, reward in result.get("train_reward", []):
            float(samples), float(reward)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise QualityError(f"{path} is not a quality result: {exc!r}") from None
    if not curve:
        raise QualityError(f"{path} holds no eval point")
    result.setdefault("train_reward", [])
    return result


def training_clock(records: list[dict[str, Any]], started: float) -> float:
    """When training starts, as the TRL peer counts it (model load and setup left out, the
    held-out evals in): the start of the before-training eval, else the process start."""
    evals = [e for e in records if e.get("event") == "eval"]
    first = min(evals, key=lambda e: e["time"], default=None)
    if first is None or first.get("eval/version") != 0:
        return started
    return first["time"] - float(first.get("eval/seconds", 0.0))


def from_metrics(
    records: list[dict[str, Any]], samples_per_step: int, started: float
) -> dict[str, Any]:
    """A run's result from its metrics.jsonl records (``started``: its process start):
    samples are learner versions x samples per step; seconds and ``wall_s`` count on the
    training clock, ``setup_s`` is what came before it."""
    t0 = training_clock(records, started)
    curve = [
        {
            "samples": float(e["eval/version"]) * samples_per_step,
            "seconds": e["time"] - t0,
            "exact": e["eval/exact_match"],
            "completed": e["eval/completed"],
            "reward_mean": e.get("eval/reward_mean", float("nan")),
        }
        for e in records
        if e.get("event") == "eval"
    ]
    curve.sort(key=lambda p: (p["seconds"], p["samples"]))
    reward = [
        [float(r["step"]) * samples_per_step, r["reward/mean"]]
        for r in records
        if "step" in r and r.get("reward/mean") is not None
    ]
    end = max((r["time"] for r in records if "step" in r or r.get("event") == "eval"), default=t0)
    return {"wall_s": end - t0, "setup_s": t0 - started, "curve": curve, "train_reward": reward}


def _machine() -> dict[str, str]:
    import torch

    from streamrl.hardware import cpu_description

    return {"cpu": cpu_description(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def _launch(command: list[str], log_path: Path) -> int:
    with open(log_path, "w") as log:
        return subprocess.run(command, stdout=log, stderr=log, stdin=subprocess.DEVNULL).returncode


def run_streamrl(
    config_path: str, arm: str, seed: int, out: Path, user: list[str], teacher: str = ""
) -> dict:
    """Train one (arm, seed) with ``streamrl launch`` in a child process (console in
    ``launch.log``) and read its curve from the run's metrics.jsonl."""
    overrides = arm_overrides(arm, seed, out, user, teacher)
    config = load_config(config_path, overrides)
    where = run_dir(out, arm, seed)
    where.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "streamrl.cli", "launch", config_path, *overrides]
    started = time.time()
    if _launch(command, where / "launch.log") != 0:
        raise QualityError(f"{arm} seed {seed} failed: see {where / 'launch.log'}")
    finished = time.time()
    run = where / "run"
    try:
        summary = json.loads((run / "summary.json").read_text())
        lines = (run / "metrics.jsonl").read_text().splitlines()
        samples_per_step = config.learner.groups_per_step * config.generator.group_size
        records = live_records([json.loads(line) for line in lines])  # the live timeline
        result = from_metrics(records, samples_per_step, started)
    except (OSError, ValueError, KeyError) as exc:
        raise QualityError(f"{arm} seed {seed}: cannot read its run {run}: {exc!r}") from None
    if not result["curve"]:
        raise QualityError(f"{arm} seed {seed}: its run logged no eval event ({run})")
    result.update(
        steps=summary["version"],
        samples_per_step=samples_per_step,
        run_wall_time_s=summary["wall_time_s"],  # the controller's, setup and export included
        process_s=finished - started,
        # Groups the shards received (kept or dropped), and those dropped (zero variance,
        # staleness, ...).
        groups_generated=sum(b["ingested"] + sum(b["dropped"].values()) for b in summary["buffer"]),
        groups_dropped=sum(sum(b["dropped"].values()) for b in summary["buffer"]),
        # Generated tokens that ended in a gradient (controller.generation_yield).
        useful_generation=summary.get("generation", {}).get("useful"),
        sampler=summary.get("sampler"),
    )
    return result


def run_peer(config_path: str, arm: str, seed: int, out: Path, user: list[str]) -> dict:
    """One seed of a peer (TRL's GRPOTrainer on the same recipe, ``benchmarks/trl_peer.py``
    in its own venv); it writes the shared result shape itself."""
    if not TRL_PYTHON.exists():
        raise QualityError(f"no {TRL_PYTHON}: run ./scripts/trl_venv.sh first")
    if not TRL_SCRIPT.exists():
        raise QualityError(f"no {TRL_SCRIPT}: the TRL peer is not in this checkout")
    where = run_dir(out, arm, seed)
    peer_out = where / "peer"
    peer_out.mkdir(parents=True, exist_ok=True)
    (peer_out / "result.json").unlink(missing_ok=True)
    command = [str(TRL_PYTHON), str(TRL_SCRIPT), "--config", config_path, "--seed", str(seed)]
    if _launch([*command, "--out", str(peer_out), *user], where / "launch.log") != 0:
        raise QualityError(f"{arm} seed {seed} failed: see {where / 'launch.log'}")
    return load_result(peer_out / "result.json")


def prune_weights(where: Path) -> None:
    """Delete a finished run's checkpoint and exported model: the bench reads only its
    metrics, and the default job leaves ~2 GB of weights per run (15 runs: 30 GB)."""
    for name in ("checkpoints", "hf"):
        shutil.rmtree(where / "run" / name, ignore_errors=True)


def run_one(
    config_path: str,
    arm: str,
    seed: int,
    out: Path,
    user: list[str],
    keep_weights: bool = False,
    teacher: str = "",
) -> dict:
    """Run one (arm, seed) to completion and store its result (or why it failed): the
    result file is the mark a rerun skips on."""
    where = run_dir(out, arm, seed)
    where.mkdir(parents=True, exist_ok=True)
    (where / "failed.json").unlink(missing_ok=True)
    try:
        if arm in PEER_ARMS:
            result = run_peer(config_path, arm, seed, out, user)
        else:
            result = run_streamrl(config_path, arm, seed, out, user, teacher)
    except QualityError as exc:
        failure = {"arm": arm, "seed": seed, "error": str(exc)}
        (where / "failed.json").write_text(json.dumps(failure))
        raise
    result.update(arm=arm, seed=seed, **_machine())
    if not keep_weights:
        prune_weights(where)
    (where / "result.json").write_text(json.dumps(result, indent=1))
    return result


def stored(out: Path, arm: str, seed: int) -> dict[str, Any] | None:
    """The finished result of (arm, seed), ``{"failed": why}`` for a failed one, or None when
    it has not run (or did not finish)."""
    where = run_dir(out, arm, seed)
    if (where / "result.json").exists():
        try:
            return load_result(where / "result.json")
        except QualityError as exc:
            return {"failed": str(exc)}
    if (where / "failed.json").exists():
        try:
            return {"failed": json.loads((where / "failed.json").read_text())["error"]}
        except (OSError, ValueError, KeyError):
            return {"failed": f"see {where}"}
    return None
