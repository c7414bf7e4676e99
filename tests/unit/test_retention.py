"""Which checkpoints a run keeps (run.keep_checkpoints, with and without eval.keep_best)."""

from __future__ import annotations

from pathlib import Path

from streamrl.checkpoint_layout import checkpoints_root, mark_latest, path_for, write_meta
from streamrl.controller.retention import checkpoints_to_keep, prune_checkpoints
from streamrl.protocol import EvalReport

METRIC = "eval/exact_match"


def _evals(*scores: tuple[int, float]) -> list[EvalReport]:
    return [EvalReport(0, v, v, {METRIC: x}, 0.0) for v, x in scores]


def _checkpoints(run_dir: Path, versions: list[int]) -> Path:
    root = checkpoints_root(run_dir)
    for v in versions:
        path = path_for(root, v)
        path.mkdir(parents=True)
        (path / "weights.distcp").write_bytes(b"x")
        write_meta(path, v)
        mark_latest(root, path)
    return root


def test_the_newest_are_kept() -> None:
    assert checkpoints_to_keep([10, 20, 30, 40], 2, [], METRIC, keep_best=False) == {30, 40}
    assert checkpoints_to_keep([10, 20], 0, [], METRIC, keep_best=False) == {10, 20}


def test_keep_best_also_keeps_the_best_and_the_not_yet_evaluated() -> None:
    evals = _evals((0, 0.05), (10, 0.25), (20, 0.30), (30, 0.10))
    # 40 is not evaluated yet; 20 is the best; 10 and 30 can never be chosen.
    assert checkpoints_to_keep([10, 20, 30, 40], 1, evals, METRIC, keep_best=True) == {20, 40}
    # The evaluation of 30 not in yet: it might still be the best.
    early = _evals((0, 0.05), (10, 0.25), (20, 0.30))
    assert checkpoints_to_keep([10, 20, 30, 40], 1, early, METRIC, True) == {20, 30, 40}
    tied = _evals((10, 0.30), (20, 0.30))  # the earliest of equals, as the summary's best
    assert checkpoints_to_keep([10, 20, 30], 1, tied, METRIC, True) == {10, 30}


def test_prune_removes_the_rest_and_never_the_latest_or_an_unfinished_one(tmp_path: Path) -> None:
    root = _checkpoints(tmp_path, [10, 20, 30, 40])
    writing = path_for(root, 50)  # a checkpoint being written: no meta.json yet
    writing.mkdir()
    evals = _evals((10, 0.25), (20, 0.30), (30, 0.10), (40, 0.12))
    removed = prune_checkpoints(tmp_path, 1, evals, METRIC, keep_best=True)
    assert removed == [10, 30]
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [
        "step-000020",
        "step-000040",
        "step-000050",
    ]
    # The newest N by version, but the one `latest` names stays whatever it is.
    mark_latest(root, path_for(root, 20))
    assert prune_checkpoints(tmp_path, 1, [], METRIC, keep_best=False) == []
