"""Multi-turn environments by name (``env.name``; docs/design.md §7).

- ``calculator``: arithmetic questions with a calculator tool (``<calc>3 + 4</calc>``);
- ``guess``: find a hidden number with "higher"/"lower" feedback each turn;
- ``module:Class``: a user's ``Environment`` subclass.

``environment_factory(config)`` gives a function that makes one fresh environment per
episode; ``check_env`` fails on a name that cannot be loaded, before any process starts.
"""

from __future__ import annotations

from collections.abc import Callable

from streamrl.config import ConfigError, EnvConfig
from streamrl.envs.base import Environment, StepResult
from streamrl.envs.calculator import Calculator
from streamrl.envs.guess import GuessNumber
from streamrl.plugins import load_named

ENVS: dict[str, type[Environment]] = {"calculator": Calculator, "guess": GuessNumber}

__all__ = ["ENVS", "Environment", "StepResult", "check_env", "environment_factory"]


def resolve_env(name: str) -> type[Environment]:
    if name in ENVS:
        return ENVS[name]
    if ":" in name:
        cls = load_named(name, "env.name")
        if not (isinstance(cls, type) and issubclass(cls, Environment)):
            raise ConfigError(f"env.name {name!r} is not a streamrl.envs.Environment subclass")
        return cls
    raise ConfigError(f"unknown env.name {name!r}: use one of {sorted(ENVS)} or module:Class")


def environment_factory(config: EnvConfig) -> Callable[[], Environment]:
    cls, args = resolve_env(config.name), dict(config.args)
    return lambda: cls(**args)


def check_env(config: EnvConfig) -> None:
    """Load the environment class and make one instance (bad ``env.args`` fail here)."""
    if not config.name:
        return
    try:
        environment_factory(config)()
    except ConfigError:
        raise
    except Exception as exc:  # a user's constructor: its message, on one line
        raise ConfigError(f"env {config.name!r} with args {config.args}: {exc}") from None
