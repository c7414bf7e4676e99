"""Shared test setup: an isolated STREAMRL_HOME per session, and the no-GPU skip for `gpu` tests."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from streamrl.models import streamrl_home

_HOME = pytest.StashKey[Path]()  # the session's STREAMRL_HOME
_SESSION_HOME = "STREAMRL_TEST_SESSION_HOME"  # how xdist workers find it


def pytest_configure(config: pytest.Config) -> None:
    """Point ``STREAMRL_HOME`` at a fresh directory for this session, before collection (some
    test modules resolve a model at import), so that nothing a test builds or writes lands in
    the user's home. The models already converted or built there (``models/<name>``, each
    published whole: converting a GGUF takes up to a minute) are linked in, read-only in use;
    a model the home lacks is built in the session's own."""
    shared = os.environ.get(_SESSION_HOME)
    if shared and os.environ.get("PYTEST_XDIST_WORKER"):
        # A pytest-xdist worker (`-n 2`): the controller's home, so that a model one worker
        # builds (Gemma's conversion takes a minute) is the other's too; the controller
        # removes it.
        os.environ["STREAMRL_HOME"] = shared
        return
    real_models = streamrl_home() / "models"
    home = Path(tempfile.mkdtemp(prefix="streamrl-home-"))
    (home / "models").mkdir()
    if real_models.is_dir():
        for model in real_models.iterdir():
            if (model / "config.json").is_file():
                (home / "models" / model.name).symlink_to(model.resolve())
    config.stash[_HOME] = home
    os.environ["STREAMRL_HOME"] = os.environ[_SESSION_HOME] = str(home)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def pytest_unconfigure(config: pytest.Config) -> None:
    home = config.stash.get(_HOME, None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)  # the links only, never what they point at


# Unit modules whose tests start a server thread, a subprocess or a process group.
_UNIT_MODULES_THAT_START_THINGS = {
    "test_admin_api.py",
    "test_admission_server.py",
    "test_cli_errors.py",
    "test_live_knobs.py",
    "test_role_specs.py",
}
_SLOW_DIRS = {"integration", "fuzz", "chaos"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--network", action="store_true", help="run tests marked network")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tiers: ``-m "not slow"`` is the quick one (no process, server or process group);
    ``network`` tests are skipped unless ``--network``; ``gpu`` ones without a GPU."""
    for item in items:
        path = Path(str(item.fspath))
        if path.parent.name in _SLOW_DIRS or path.name in _UNIT_MODULES_THAT_START_THINGS:
            item.add_marker(pytest.mark.slow)
        if "network" in item.keywords and not config.getoption("--network"):
            item.add_marker(pytest.mark.skip(reason="needs the package index: run with --network"))
    _skip_gpu_tests(items)


def _skip_gpu_tests(items: list[pytest.Item]) -> None:
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def ctx():
    """A ZeroMQ context for one test, destroyed (linger 0) when it ends."""
    import zmq

    context = zmq.Context()
    yield context
    context.destroy(linger=0)
