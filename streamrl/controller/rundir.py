"""The run directory: where a run's files go, refused when it would overwrite a finished run,
or resumed on other data than it started with (``check_resume_pinned``)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import msgspec

from streamrl.config import Config, to_yaml
from streamrl.files import atomic_write_text

log = logging.getLogger("streamrl")


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
    if not config.run.resume or not (run_dir / DATA_PIN).is_file():
        pin_run_data(config, run_dir)
    return run_dir


# What a run's prompt stream was made of at its first launch (``data.data_fingerprint``).
DATA_PIN = "data_pin.json"
# Data settings a resume may change: how prompts are drawn, not which row prompt i is.
UNPINNED_DATA = ("sampler", "difficulty_keep")


def _fingerprint(config: Config) -> dict[str, Any]:
    from streamrl.data import data_fingerprint  # reads the table: not on every rundir import

    found = json.loads(json.dumps(data_fingerprint(config)))  # as it reads back from disk
    for key in UNPINNED_DATA:
        found["data"].pop(key, None)
    return found


def pin_run_data(config: Config, run_dir: Path) -> None:
    """Record ``run.seed``, the ``data`` section and the training table's row count and
    digest in ``data_pin.json`` (what ``check_resume_pinned`` holds a resume to)."""
    atomic_write_text(Path(run_dir) / DATA_PIN, json.dumps(_fingerprint(config), indent=1))


def check_resume_pinned(config: Config, run_dir: Path | None = None) -> None:
    """For ``run.resume``: ``RunError`` in one line naming what differs when ``run.seed``, a
    ``data`` setting (but ``UNPINNED_DATA``) or the training rows' content are not what the
    run started with (``data_pin.json``); the prompt ledger's indices name rows of that
    stream, so other data would train some rows twice and others never. A new run (no
    ``--resume``) is never refused here. Reads the table; writes nothing. A run directory
    from before the pin is let through with a warning (``prepare_run_dir`` pins it then).

    Example: a run started with ``data.max_rows=80``, resumed with ``data.max_rows=40``:
    ``--resume: data.max_rows is 40, the run started with 80 (...)``."""
    if not config.run.resume:
        return
    run_dir = (
        Path(run_dir) if run_dir is not None else Path(config.run.output_dir) / config.run.name
    )
    path = run_dir / DATA_PIN
    if not path.is_file():
        log.warning("%s has no %s (an older run): its data cannot be checked", run_dir, DATA_PIN)
        return
    try:
        then = json.loads(path.read_text())
        then_data, then_table = dict(then["data"]), then["table"]
    except (ValueError, KeyError, TypeError) as exc:
        raise RunError(f"{path}: unreadable ({exc}); cannot check the run's data") from None
    now = _fingerprint(config)
    differs = []
    if now["seed"] != then.get("seed"):
        differs.append(f"run.seed is {now['seed']}, the run started with {then.get('seed')}")
    for key in sorted(set(now["data"]) | set(then_data)):
        if key not in UNPINNED_DATA and now["data"].get(key) != then_data.get(key):
            differs.append(
                f"data.{key} is {now['data'].get(key)!r}, the run started with "
                f"{then_data.get(key)!r}"
            )
    if not differs and now["table"] != then_table:  # same settings, other rows
        differs.append(
            f"the training rows of data.source {config.data.source} changed since the run "
            f"started ({_table_text(now['table'])} now, {_table_text(then_table)} then)"
        )
    if differs:
        raise RunError(
            f"--resume: {'; '.join(differs)}: a resumed run continues its prompt stream on "
            "the data it started with (start a new run instead: launch without --resume, "
            "under another --name or with run.overwrite=true)"
        )


def _table_text(table: dict[str, Any] | None) -> str:
    if not table:
        return "no table"
    return f"{table['rows']} rows, digest {str(table['digest'])[:12]}"


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
