"""The run directory: where a run's files go, refused when it would overwrite a finished run."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec

from streamrl.config import Config, to_yaml


class RunError(RuntimeError):
    """A run that cannot start or continue; the message is one line for the user."""


def _without_secrets(config: Config) -> Config:
    # The admin token never goes on disk in clear (admin.token, 0600, is the place for it).
    return msgspec.structs.replace(config, admin=msgspec.structs.replace(config.admin, token=None))


def prepare_run_dir(config: Config) -> Path:
    run_dir = Path(config.run.output_dir) / config.run.name
    if config.run.resume:
        if not (run_dir / "config.yaml").is_file():
            raise RunError(f"nothing to resume: {run_dir} is not a run directory")
    elif run_dir.exists() and any(run_dir.iterdir()):
        if not config.run.overwrite:
            raise RunError(
                f"run directory {run_dir} already exists; "
                "pick another --name or set run.overwrite=true"
            )
        shutil.rmtree(run_dir)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(_without_secrets(config)))
    return run_dir


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
