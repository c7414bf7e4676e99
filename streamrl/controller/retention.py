"""Which checkpoints a run keeps (``run.keep_checkpoints``), as HF Trainer's
``save_total_limit`` with ``load_best_model_at_end`` does: the newest N complete ones, and
with ``eval.keep_best`` also the best evaluated version's and every one not evaluated yet
(its evaluation, which comes later, may make it the best). The checkpoint ``latest`` names
is never removed, nor one still being written.

Example: checkpoints at 10, 20, 30, 40; evaluations of 10 (0.25), 20 (0.30), 30 (0.10);
newest 1 with keep_best: 20 (best), 40 (newest, not evaluated yet) stay; 10 and 30 go.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from streamrl.checkpoint_layout import checkpoints_root, complete_checkpoints, latest, version_of
from streamrl.controller.records import keep_best
from streamrl.protocol import EvalReport


def checkpoints_to_keep(
    versions: list[int], newest: int, evals: list[EvalReport], metric: str, keep_best: bool
) -> set[int]:
    """The versions among ``versions`` to keep (``evals``: the run's live evaluations)."""
    keep = set(sorted(versions)[-newest:]) if newest > 0 else set(versions)
    if keep_best:
        evaluated = max((e.version for e in evals), default=-1)
        keep |= {v for v in versions if v > evaluated}
        scored = [e for e in evals if metric in e.metrics]
        if scored:  # the earliest of equals, as records.best_evaluation picks
            keep.add(max(scored, key=lambda e: (e.metrics[metric], -e.version)).version)
    return keep


def prune_checkpoints(
    run_dir: Path, newest: int, evals: list[EvalReport], metric: str, keep_best: bool
) -> list[int]:
    """Remove the complete checkpoints ``checkpoints_to_keep`` leaves out; their versions."""
    root = checkpoints_root(run_dir)
    found = {v: p for p in complete_checkpoints(root) if (v := version_of(p)) is not None}
    keep = checkpoints_to_keep(list(found), newest, evals, metric, keep_best)
    newest_path = latest(root)
    if newest_path is not None:
        keep.add(version_of(newest_path))
    removed = sorted(v for v in found if v not in keep)
    for version in removed:
        shutil.rmtree(found[version], ignore_errors=True)
    return removed


class Retention:
    """A run's checkpoints and model by its evaluations (the controller's one owner of them):
    ``prune`` after each checkpoint (``run.keep_checkpoints``: 0 keeps all), and ``finish`` at
    the end, where ``eval.keep_best`` makes the best evaluated version ``hf/`` and
    ``model_version`` says which (None: the last)."""

    def __init__(
        self,
        run_dir: Path,
        newest: int,
        keep_best: bool,
        metric: str,
        live_evals: Callable[[], list[EvalReport]],
    ) -> None:
        self.run_dir, self.newest, self.keep_best, self.metric = run_dir, newest, keep_best, metric
        self.live_evals = live_evals  # the run's evaluations of weights still its own
        self.model_version: int | None = None

    def prune(self) -> None:
        if self.newest > 0:
            evals = self.live_evals()
            prune_checkpoints(self.run_dir, self.newest, evals, self.metric, self.keep_best)

    def finish(self, console: TextIO) -> None:
        """After the export of the last version: the best one as ``hf/`` if asked, then a
        last prune (which keeps that best)."""
        if self.keep_best:
            self.model_version = keep_best(self.live_evals(), self.metric, self.run_dir, console)
        self.prune()
