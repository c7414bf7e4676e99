"""``streamrl.files``: a file is replaced whole, with its mode, or left as it was."""

from __future__ import annotations

import os
import stat

import pytest

from streamrl.files import atomic_write_bytes, atomic_write_text, atomic_writer


def test_replaces_the_file_and_leaves_no_temporary(tmp_path) -> None:
    path = tmp_path / "pids.json"
    path.write_text("old")
    atomic_write_text(path, "new")
    assert path.read_text() == "new"
    atomic_write_bytes(path, b"\x00\x01", durable=True)
    assert path.read_bytes() == b"\x00\x01"
    assert [p.name for p in tmp_path.iterdir()] == ["pids.json"]


def test_an_error_leaves_the_old_file_and_no_temporary(tmp_path) -> None:
    path = tmp_path / "prompts.json"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_writer(path, durable=True) as f:
        f.write(b"half")
        raise RuntimeError("the writer died")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["prompts.json"]


def test_mode_is_exact_whatever_the_umask(tmp_path) -> None:
    """A secret is 0600 from its first byte; an explicit mode is kept past a strict umask."""
    old = os.umask(0o077)
    try:
        atomic_write_text(tmp_path / "admin.url", "http://x\n", mode=0o644)
        with atomic_writer(tmp_path / "admin.token", mode=0o600) as f:
            temporary = next(p for p in tmp_path.iterdir() if p.name.endswith(".tmp"))
            assert stat.S_IMODE(temporary.stat().st_mode) == 0o600
            f.write(b"secret\n")
        atomic_write_text(tmp_path / "plain", "x")  # no mode: the umask decides, as open() does
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "admin.url").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "admin.token").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o600
