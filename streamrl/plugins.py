"""A user's code named in a config as ``module:attr`` (a reward function, an environment
class): loaded here, for every kind, with the same one-line error."""

from __future__ import annotations

import importlib
from typing import Any

from streamrl.config import ConfigError


def load_named(name: str, key: str) -> Any:
    """The object ``name`` (``module:attr``) names; ``ConfigError`` naming the config ``key``
    if the module or the attribute cannot be loaded."""
    module_name, _, attr = name.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{key} {name!r} cannot be loaded: {exc}") from None
