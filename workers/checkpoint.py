"""Learner checkpoints with torch.distributed.checkpoint (docs/design.md §9).

Layout: ``runs/<name>/checkpoints/step-000012/`` holds the sharded DCP files of the policy, its
optimizer (and the critic's, when there is one) plus ``meta.json``; ``checkpoints/latest``
names the newest complete one. Every rank writes its own shards (no gather); ``latest`` moves
only after the save finished on every rank, so a crash mid-save leaves the previous one.

Example: ``save(modules, root, 12)`` on every rank -> ``root/step-000012`` and
``root/latest == "step-000012"``; ``load(modules, root)`` on a fresh group returns 12.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from streamrl.files import atomic_write_text

# name -> (module, optimizer): "policy" always, "critic" with GAE.
Modules = dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]


def _state(modules: Modules) -> dict[str, dict]:
    return {
        name: {"model": get_model_state_dict(m), "optim": get_optimizer_state_dict(m, opt)}
        for name, (m, opt) in modules.items()
    }


def path_for(root: Path, version: int) -> Path:
    return root / f"step-{version:06d}"


def save(modules: Modules, root: Path, version: int, extra: dict | None = None) -> Path:
    """Collective: every rank calls it. ``extra`` (JSON-able, e.g. the adaptive KL
    coefficient) goes into ``meta.json`` beside the version. Returns the directory."""
    path = path_for(root, version)
    dcp.save(_state(modules), checkpoint_id=str(path))
    dist.barrier()
    if dist.get_rank() == 0:
        (path / "meta.json").write_text(json.dumps({"version": version, "extra": extra or {}}))
        atomic_write_text(root / "latest", path.name)
    dist.barrier()
    return path


def latest(root: Path) -> Path | None:
    marker = root / "latest"
    if not marker.is_file():
        return None
    path = root / marker.read_text().strip()
    return path if (path / "meta.json").is_file() else None


def load(modules: Modules, path: Path) -> tuple[int, dict]:
    """Collective: load a checkpoint into already-sharded modules; returns its version and
    the ``extra`` state saved with it."""
    state = _state(modules)
    dcp.load(state, checkpoint_id=str(path))
    for name, (module, optimizer) in modules.items():
        set_model_state_dict(module, state[name]["model"])
        set_optimizer_state_dict(module, optimizer, state[name]["optim"])
    meta = json.loads((path / "meta.json").read_text())
    return int(meta["version"]), dict(meta.get("extra", {}))
