"""How a run's checkpoints lie on disk, and which one is the newest (docs/design.md §9).

The one owner of the layout; the learner saves into it (``workers.learning.checkpoint``), the
controller resumes from it (``controller.rundir``) and ``streamrl export`` reads it
(``streamrl.export``)::

    runs/<name>/checkpoints/
        step-000012/     the sharded torch.distributed.checkpoint files of every rank, and
            meta.json    {"version": 12, "extra": {...}}, written after every rank saved
        latest           "step-000012": the newest complete checkpoint, moved last

A checkpoint is complete when its ``meta.json`` exists; ``latest`` names a complete one, so
a crash mid-save leaves the previous checkpoint as the newest. Stdlib only (no torch): the
controller and the CLI read the layout before anything heavy is imported.

Example: ``path_for(root, 12) == root / "step-000012"``; ``version_of(root / "step-000012")
== 12``; after ``write_meta(path, 12, {})`` and ``mark_latest(root, path)``,
``latest(root) == path``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from streamrl.files import atomic_write_text

CHECKPOINTS_DIR = "checkpoints"  # under the run directory
LATEST_FILE = "latest"
META_FILE = "meta.json"
_STEP_NAME = re.compile(r"^step-(\d{6,})$")


def checkpoints_root(run_dir: Path) -> Path:
    """The directory that holds a run's checkpoints."""
    return Path(run_dir) / CHECKPOINTS_DIR


def path_for(root: Path, version: int) -> Path:
    """The directory of the checkpoint of ``version`` (zero-padded, so names sort by version)."""
    return Path(root) / f"step-{version:06d}"


def version_of(path: Path) -> int | None:
    """The version a checkpoint directory's name says, or None for any other name."""
    match = _STEP_NAME.match(Path(path).name)
    return int(match.group(1)) if match else None


def is_complete(path: Path) -> bool:
    """True once every rank saved and ``meta.json`` was written."""
    return (Path(path) / META_FILE).is_file()


def complete_checkpoints(root: Path) -> list[Path]:
    """Every complete checkpoint under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(version_of(p), p) for p in root.iterdir() if p.is_dir()]
    return [p for v, p in sorted((v, p) for v, p in found if v is not None) if is_complete(p)]


def latest(root: Path) -> Path | None:
    """The checkpoint ``latest`` names, if it is complete; None before the first one."""
    marker = Path(root) / LATEST_FILE
    if not marker.is_file():
        return None
    path = Path(root) / marker.read_text().strip()
    return path if is_complete(path) else None


def write_meta(path: Path, version: int, extra: dict[str, Any] | None = None) -> None:
    """Mark ``path`` complete: its version and the JSON-able state saved beside the weights
    (e.g. the adaptive KL coefficient). Written whole, so a reader never sees half of it."""
    meta = {"version": version, "extra": extra or {}}
    atomic_write_text(Path(path) / META_FILE, json.dumps(meta))


def read_meta(path: Path) -> tuple[int, dict[str, Any]]:
    """(version, extra) of a complete checkpoint."""
    meta = json.loads((Path(path) / META_FILE).read_text())
    return int(meta["version"]), dict(meta.get("extra", {}))


def mark_latest(root: Path, path: Path) -> None:
    """Make ``path`` the newest checkpoint; call it after ``write_meta``."""
    atomic_write_text(Path(root) / LATEST_FILE, Path(path).name)
