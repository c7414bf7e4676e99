"""``streamrl.checkpoint_layout``: names, completeness and the newest checkpoint, without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from streamrl import checkpoint_layout as layout
from streamrl.export import ExportError, checkpoint_dir


def _save(root, version: int, extra: dict | None = None):
    """What ``workers.learning.checkpoint.save`` does around the DCP files, in its order."""
    path = layout.path_for(root, version)
    path.mkdir(parents=True)
    layout.write_meta(path, version, extra)
    layout.mark_latest(root, path)
    return path


def test_names_round_trip_and_sort_by_version(tmp_path) -> None:
    assert layout.path_for(tmp_path, 12) == tmp_path / "step-000012"
    assert layout.version_of(tmp_path / "step-000012") == 12
    assert layout.version_of(tmp_path / "step-1234567") == 1234567
    assert layout.version_of(tmp_path / "latest") is None
    assert layout.version_of(tmp_path / "step-12") is None
    assert layout.checkpoints_root(tmp_path) == tmp_path / "checkpoints"


def test_latest_is_the_newest_complete_checkpoint(tmp_path) -> None:
    root = layout.checkpoints_root(tmp_path)
    assert layout.latest(root) is None
    assert layout.complete_checkpoints(root) == []
    _save(root, 3)
    newest = _save(root, 12, {"kl_coef": 0.1})
    layout.path_for(root, 15).mkdir()  # a save that died before meta.json: not complete
    assert layout.latest(root) == newest
    assert layout.complete_checkpoints(root) == [layout.path_for(root, 3), newest]
    assert layout.read_meta(newest) == (12, {"kl_coef": 0.1})
    (root / layout.LATEST_FILE).write_text("step-000015")  # names an incomplete one
    assert layout.latest(root) is None


def test_export_finds_checkpoints_through_the_layout(tmp_path) -> None:
    root = layout.checkpoints_root(tmp_path)
    with pytest.raises(ExportError, match="no checkpoint"):
        checkpoint_dir(tmp_path, None)
    _save(root, 3)
    _save(root, 8)
    assert checkpoint_dir(tmp_path, None) == layout.path_for(root, 8)
    assert checkpoint_dir(tmp_path, 3) == layout.path_for(root, 3)
    with pytest.raises(ExportError, match=r"have: step-000003, step-000008"):
        checkpoint_dir(tmp_path, 5)


@pytest.mark.slow  # a subprocess
def test_reading_the_layout_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "from streamrl.checkpoint_layout import latest\n"
        "from streamrl.export import checkpoint_dir\n"
        "bad = [m for m in ('torch', 'zmq', 'ray') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
