"""Learner checkpoints with torch.distributed.checkpoint (docs/design.md §9).

Every rank writes its own shards (no gather) into ``path_for(root, version)``; rank 0 then
writes ``meta.json`` and moves ``latest``, only after the save finished on every rank, so a
crash mid-save leaves the previous one. The layout (names, ``meta.json``, ``latest``) is
``streamrl.checkpoint_layout``'s; this module adds what needs torch.

Example: ``save(modules, root, 12)`` on every rank -> ``root/step-000012`` and
``root/latest == "step-000012"``; ``load(modules, latest(root))`` on a fresh group returns 12.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from streamrl.checkpoint_layout import latest, mark_latest, path_for, read_meta, write_meta

# The learner finds its checkpoints through this module (``checkpoint.latest``).
__all__ = ["Modules", "latest", "load", "path_for", "save"]

# name -> (module, optimizer): "policy" always, "critic" with GAE.
Modules = dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]


# A LoRA model's frozen base is not saved: every role loads it from the model directory.
_TRAINED = StateDictOptions(ignore_frozen_params=True)


def _state(modules: Modules) -> dict[str, dict]:
    return {
        name: {
            "model": get_model_state_dict(m, options=_TRAINED),
            "optim": get_optimizer_state_dict(m, opt),
        }
        for name, (m, opt) in modules.items()
    }


def save(modules: Modules, root: Path, version: int, extra: dict | None = None) -> Path:
    """Collective: every rank calls it. ``extra`` (JSON-able, e.g. the adaptive KL
    coefficient) goes into ``meta.json`` beside the version. Returns the directory."""
    path = path_for(root, version)
    dcp.save(_state(modules), checkpoint_id=str(path))
    dist.barrier()
    if dist.get_rank() == 0:
        write_meta(path, version, extra)
        mark_latest(root, path)
    dist.barrier()
    return path


def load(modules: Modules, path: Path) -> tuple[int, dict]:
    """Collective: load a checkpoint into already-sharded modules; returns its version and
    the ``extra`` state saved with it."""
    state = _state(modules)
    dcp.load(state, checkpoint_id=str(path))
    for name, (module, optimizer) in modules.items():
        frozen = {n for n, p in module.named_parameters() if not p.requires_grad}
        keys = set_model_state_dict(
            module, state[name]["model"], options=StateDictOptions(strict=False)
        )
        # Not strict only about the frozen parameters, which the checkpoint leaves out.
        unexpected = list(keys.unexpected_keys)
        missing = [k for k in keys.missing_keys if k not in frozen]
        if unexpected or missing:
            raise RuntimeError(f"{path}: {name} keys do not match: {(unexpected + missing)[:3]}")
        set_optimizer_state_dict(module, optimizer, state[name]["optim"])
    return read_meta(path)
