"""Shared fixtures: an isolated STREAMRL_HOME per session, and the no-GPU skip for `gpu` tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def _streamrl_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    # Tests build tiny models under their own home, but SmolLM2 conversion is reused if cached.
    os.environ.setdefault("STREAMRL_HOME", str(Path.home() / ".cache" / "streamrl"))
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
