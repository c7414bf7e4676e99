"""streamrl: asynchronous, off-policy, streaming RL for LLM post-training.

From a shell, ``streamrl launch``; from Python, ``streamrl.train`` (``streamrl.api``)::

    import streamrl
    result = streamrl.train(model="tiny-random-llama", config="tiny")

The names below load on first use (PEP 562): this file runs whenever any streamrl module is
imported, in every role and in ``streamrl --help``, which must stay free of torch and Ray,
and the reward code ``RewardInput`` lives with is not every module's business either.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what a type checker and an IDE see; nothing is imported at run time
    from streamrl.api import RunResult, train
    from streamrl.config import Config, load_config
    from streamrl.rewards import RewardInput

# Exported name -> the module that defines it.
_EXPORTS = {
    "train": "streamrl.api",
    "RunResult": "streamrl.api",
    "Config": "streamrl.config",
    "load_config": "streamrl.config",
    "RewardInput": "streamrl.rewards",
}

__all__ = ["Config", "RewardInput", "RunResult", "load_config", "train"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'streamrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
