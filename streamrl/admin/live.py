"""Checking a ``PATCH /config`` against the live-key table (``controller.knobs``).

A patch is a flat JSON object of dotted keys, ``{"buffer.capacity": 128, "buffer.sampling":
"random"}``, checked here in full before the controller sees any of it (all or nothing):

- an unknown key, a value of the wrong type or out of range → ``PatchError(422)``;
- a real config key that cannot change while the run goes on (``learner.lr``) → ``PatchError(409)``
  naming it; so is ``buffer.max_staleness`` in a ``run.mode=sync`` run, where it is fixed at 0.

Types come from the config Structs themselves (``msgspec.convert`` against the field's
annotation); ranges from the same annotation (``config.key_rule``) and the rules between keys
from ``key_rules.cross_key_problems``: the rules the config checks, so a patch is held
to the rules the run's config was loaded under. Values are converted
strictly: ``"128"`` is not an int (the CLI parses ``KEY=VALUE`` as YAML before sending, as
``streamrl launch`` overrides do).

Example: with ``buffer.max_staleness = 2``, ``{"buffer.max_staleness": 0, "learner.lr": 1}``
changes nothing and answers 409 ``learner.lr``; ``{"buffer.max_staleness": 0}`` then applies.
"""

from __future__ import annotations

import math
import typing
from functools import cache
from typing import Any

import msgspec

from streamrl.config import Config
from streamrl.config.key_rules import cross_key_problems
from streamrl.controller.knobs import LIVE_KEYS, LiveKey

_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


class PatchError(Exception):
    """A patch refused as a whole; ``status`` is the HTTP status (409 or 422)."""

    def __init__(self, status: int, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.status, self.problems = status, problems


@cache
def config_key_types() -> dict[str, Any]:
    """Every dotted leaf key of ``Config`` → its annotated type (``buffer.capacity`` → int)."""
    out: dict[str, Any] = {}

    def walk(struct: type, prefix: str) -> None:
        for name, tp in typing.get_type_hints(struct).items():
            if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
                walk(tp, f"{prefix}{name}.")
            else:
                out[f"{prefix}{name}"] = tp

    walk(Config, "")
    return out


def describe(key: str) -> dict[str, str]:
    """A live key's type, rule and where it takes effect (served by ``GET /config/live``)."""
    live, tp = LIVE_KEYS[key], config_key_types()[key]
    return {"type": _type_name(tp), "rule": live.rule.wants, "applies": live.where}


def live_values(config: dict[str, Any]) -> dict[str, Any]:
    """The current value of every live key, read from a resolved config as builtins."""
    return {key: _lookup(config, key) for key in LIVE_KEYS}


def validate_patch(changes: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """Check a whole patch against the live table and ``config`` (the run's resolved config).

    Returns the changes converted to the config's types; raises ``PatchError`` with every
    problem found (422 if any key is unknown or any value bad, else 409 for non-live keys).
    """
    types = config_key_types()
    bad: list[str] = []
    frozen: list[str] = []
    converted: dict[str, Any] = {}
    for key, value in changes.items():
        if key not in types:
            is_section = any(known.startswith(f"{key}.") for known in types)
            bad.append(
                f"{key}: a config section, not a key"
                if is_section
                else f"{key}: unknown config key"
            )
        elif key not in LIVE_KEYS:
            frozen.append(f"{key} cannot change while the run is live")
        else:
            try:
                converted[key] = _convert(LIVE_KEYS[key], types[key], value)
            except ValueError as exc:
                bad.append(f"{key}: {exc}")
    if not bad and not frozen:
        frozen, more_bad = _cross_checks(converted, config)
        bad += more_bad
    if bad:
        raise PatchError(422, bad)
    if frozen:
        raise PatchError(409, frozen)
    return converted


def _convert(live: LiveKey, tp: Any, value: Any) -> Any:
    try:
        value = msgspec.convert(value, tp, strict=True)
    except msgspec.ValidationError as exc:
        if typing.get_origin(tp) is typing.Literal:
            raise ValueError(f"must be {_type_name(tp)}, got {value!r}") from None
        raise ValueError(str(exc)) from None
    # JSON allows ints of any size, and 1e400 parses as inf. An int must fit msgpack's 64 bits
    # to reach the roles (AdmissionReply, Reconfigure); no knob means anything when infinite.
    if isinstance(value, int) and not isinstance(value, bool) and not _I64_MIN <= value <= _I64_MAX:
        raise ValueError(f"must fit in 64 bits, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be finite, got {value!r}")
    problem = live.rule.problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _cross_checks(changes: dict[str, Any], config: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The rules between keys (``key_rules.cross_key_problems``) on the run's config with the
    patch applied. Returns (pinned, bad): messages for 409 and for 422."""

    def after(key: str) -> Any:
        return changes[key] if key in changes else _lookup(config, key)

    problems = cross_key_problems(after)
    return [p.message for p in problems if p.pinned], [p.message for p in problems if not p.pinned]


def _lookup(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = node[part]
    return node


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is typing.Literal:
        return "one of " + "|".join(str(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp))
