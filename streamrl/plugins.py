"""A user's code named in a config (a reward function, an environment class, an engine):
loaded here, for every kind, with the same one-line error. Two spellings:

- ``module:attr``: imported by every process that resolves it;
- ``python:<name>``: an object ``streamrl.train`` was given, registered by name in this
  process's table (``streamrl.callables``: the controller's own, and each generator's from its
  spec), for code that no role could import by name (a notebook's function, a closure).
"""

from __future__ import annotations

import importlib
from typing import Any

from streamrl import callables
from streamrl.config import ConfigError


def load_named(name: str, key: str) -> Any:
    """The object ``name`` (``module:attr`` or ``python:<name>``) names; ``ConfigError``
    naming the config ``key`` if the module or the attribute cannot be loaded, or if no
    ``python:`` object of that name is registered in this process."""
    if callables.is_python_name(name):
        return callables.lookup(name, key)
    module_name, _, attr = name.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{key} {name!r} cannot be loaded: {exc}") from None
