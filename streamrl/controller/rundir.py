"""The run directory: where a run's files go, refused when it would overwrite a finished run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec

from streamrl.config import Config, to_yaml
from streamrl.files import atomic_write_text


class RunError(RuntimeError):
    """A run that cannot start or continue; the message is one line for the user."""


def _without_secrets(config: Config) -> Config:
    # The admin token never goes on disk in clear (admin.token, 0600, is the place for it).
    return msgspec.structs.replace(config, admin=msgspec.structs.replace(config.admin, token=None))


# What ``streamrl.train`` writes into a run directory before the run starts: a notebook's
# ``datasets.Dataset``, saved there for ``data.source`` (``streamrl.api``). It is this run's
# input, not an earlier run's record: it neither makes the directory taken nor goes with
# ``run.overwrite``.
STAGED_DATASET = "dataset"


def check_run_dir(config: Config) -> Path:
    """The run's directory (``<output_dir>/<name>``), if the run may use it: ``RunError`` when
    it holds an earlier run and ``run.overwrite`` is not set, or, for ``run.resume``, when it
    holds none. Writes nothing (``streamrl.train`` asks before staging its dataset)."""
    run_dir = Path(config.run.output_dir) / config.run.name
    if config.run.resume:
        if not (run_dir / "config.yaml").is_file():
            raise RunError(f"nothing to resume: {run_dir} is not a run directory")
    elif _earlier_run(run_dir) and not config.run.overwrite:
        raise RunError(
            f"run directory {run_dir} already exists; pick another --name or set run.overwrite=true"
        )
    return run_dir


def prepare_run_dir(config: Config) -> Path:
    run_dir = check_run_dir(config)
    if not config.run.resume:
        for path in _earlier_run(run_dir):  # run.overwrite (check_run_dir refused otherwise)
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(_without_secrets(config)))
    return run_dir


def _earlier_run(run_dir: Path) -> list[Path]:
    """What the directory holds besides a dataset staged for this run."""
    if not run_dir.exists():
        return []
    return [path for path in run_dir.iterdir() if path.name != STAGED_DATASET]


def last_line(exc: BaseException) -> str:
    """Ray wraps a role's traceback into the message; its last line is the actual error."""
    text = str(exc).strip()
    line = text.splitlines()[-1].strip() if text else repr(exc)
    # Ray's paragraph for an actor whose process vanished (kill -9, OOM, segfault).
    if "worker process has died" in line or "The actor died unexpectedly" in line:
        return "its process died (killed, out of memory, or crashed; see its log)"
    if "node was terminated unexpectedly" in line:
        return "its node died (" + line.split(":", 1)[-1].strip() + ")"
    return line


CLOCK_FILE = "clock.json"  # the learner clock's epoch and forks (``streamrl.clock``)


def save_clock(run_dir: Path, epoch: int, forks: list[int]) -> None:
    """Persist the learner group's epoch and forks, written before a group of that epoch
    trains: a resume must start an epoch above every one whose groups a log may hold."""
    text = json.dumps({"epoch": epoch, "forks": list(forks)})
    atomic_write_text(Path(run_dir) / CLOCK_FILE, text)


def load_clock(run_dir: Path) -> tuple[int, list[int]]:
    """The newest epoch a run's learner groups reached and its forks; ``(0, [])`` for a run
    directory without ``clock.json`` (written since resume became a new epoch)."""
    path = Path(run_dir) / CLOCK_FILE
    if not path.is_file():
        return 0, []
    try:
        saved = json.loads(path.read_text())
        epoch, forks = int(saved["epoch"]), [int(v) for v in saved["forks"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise RunError(f"{path}: unreadable learner clock ({exc}); cannot resume safely") from None
    if len(forks) != epoch:
        raise RunError(f"{path}: epoch {epoch} with {len(forks)} forks; cannot resume safely")
    return epoch, forks


def resume_clock(
    run_dir: Path, checkpoint_version: int | None, checkpoint_extra: dict | None = None
) -> tuple[int, list[int]]:
    """The epoch and forks a ``--resume`` starts its learner group in: one epoch above the
    newest the run reached (``clock.json``, or the checkpoint's own record if that is newer),
    forked at the checkpoint it resumes from, so the shards drop every logged group sampled
    after it (``dead_timeline``). Without a checkpoint the fork is -1: no earlier weights are
    kept and the prompt stream starts over."""
    epoch, forks = load_clock(run_dir)
    extra = checkpoint_extra or {}
    if int(extra.get("epoch", -1)) > epoch:  # a run directory from before clock.json
        epoch, forks = int(extra["epoch"]), [int(v) for v in extra.get("forks", [])]
        forks = (forks + [checkpoint_version or 0] * epoch)[:epoch]
    fork = -1 if checkpoint_version is None else checkpoint_version
    return epoch + 1, [*forks, fork]
