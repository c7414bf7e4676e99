"""The range rule of every config key that more than one reader checks, and the rules between keys.

A live key (``controller.knobs``) is checked three times: when the config loads
(``config._finalize``), when an admin patch arrives (``admin.live.validate_patch``) and when a
buffer shard applies it (``buffers.replay.check_policy_value``, which reads the shard's
``buffer.capacity_tokens`` here too). Each such key's rule is one row of ``KEY_RULES`` and all
three readers ask the row, so they cannot drift apart: the shard refuses exactly what the
config and the admin API refuse, in the same words. Keys that only the config reads keep their
rule in ``config._finalize``.

Rules between keys (a batch that must divide across learners, staleness that needs a
correction) are one function, ``cross_key_problems``; the config and the admin API both call
it, the admin API with the patch applied.

This module is a leaf (stdlib only): the config module, which imports no more than msgspec and
yaml, and the torch-free buffer shard both import it.

Example::

    KEY_RULES["buffer.capacity"].problem(0)      # "must be >= 1, got 0"
    KEY_RULES["buffer.capacity"].problem(True)   # "must be an integer, got True"
    KEY_RULES["buffer.capacity"].problem(8)      # None: allowed
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

# The choices of the choice keys, written once: the config Structs and the shard's policy
# annotate their fields with these, and the rows below check against them.
Sampling = Literal["fifo", "random", "freshest"]
Overflow = Literal["drop-oldest", "block"]

# A larger generator pool is almost surely a typo (each generator is a process with a model).
MAX_GENERATORS = 1024


@dataclass(frozen=True)
class KeyRule:
    """What one key accepts: a value of ``kind`` (or None when ``nullable``) inside a range.

    ``wants`` says the range in words; it is the whole error message's middle and what
    ``GET /config/live`` shows as the key's rule.
    """

    kind: type  # int, float, bool or str; bool is never an int here
    wants: str
    in_range: Callable[[Any], bool]
    nullable: bool = False

    def problem(self, value: Any) -> str | None:
        """None if ``value`` is allowed, else one line: ``must be <what>, got <value>``."""
        if value is None and self.nullable:
            return None
        if not self._has_kind(value):
            words = {int: "an integer", float: "a number"}.get(self.kind, self.wants)
            return f"must be {words}{' or null' if self.nullable else ''}, got {value!r}"
        if not self.in_range(value):
            return f"must be {self.wants}, got {value!r}"
        return None

    def _has_kind(self, value: Any) -> bool:
        if isinstance(value, bool) or self.kind is bool:
            return isinstance(value, bool) and self.kind is bool
        if self.kind is float:
            return isinstance(value, int | float)  # a YAML or JSON 1 is a fine temperature
        return isinstance(value, self.kind)


def _at_least(low: int, *, nullable: bool = False) -> KeyRule:
    wants = f">= {low}" + (" (or null)" if nullable else "")
    return KeyRule(int, wants, lambda v: v >= low, nullable)


def _one_of(choices: Any) -> KeyRule:
    allowed = typing.get_args(choices)
    return KeyRule(str, "one of " + "|".join(allowed), lambda v: v in allowed)


KEY_RULES: dict[str, KeyRule] = {
    "buffer.capacity": _at_least(1),
    "buffer.capacity_tokens": _at_least(1, nullable=True),
    "buffer.max_staleness": _at_least(0),
    "buffer.sampling": _one_of(Sampling),
    "buffer.max_reuse": _at_least(1),
    "buffer.overflow": _one_of(Overflow),
    "buffer.drop_zero_variance": KeyRule(bool, "true or false", lambda v: True),
    "generator.temperature": KeyRule(float, "> 0", lambda v: v > 0),
    "generator.prompts_per_call": _at_least(1),
    "generator.count": KeyRule(
        int, f"in [1, {MAX_GENERATORS}]", lambda v: 1 <= v <= MAX_GENERATORS
    ),
}


class Conflict(NamedTuple):
    """A rule between keys that does not hold; ``message`` is one line for the user."""

    message: str
    # A key held at one value by another key (run.mode=sync pins buffer.max_staleness to 0):
    # the admin API answers 409 (cannot change now), not 422 (a bad value).
    pinned: bool = False


def cross_key_problems(value: Callable[[str], Any]) -> list[Conflict]:
    """Every rule between keys that does not hold; ``value("learner.count")`` reads a key.

    The config passes its own values; the admin API passes the run's values with the patch
    applied, so a live change is refused where the same config would not load.
    """
    problems: list[Conflict] = []
    staleness = value("buffer.max_staleness")
    if value("run.mode") == "sync":
        if staleness != 0:
            problems.append(
                Conflict("buffer.max_staleness is fixed at 0 in a run.mode=sync run", pinned=True)
            )
    elif (
        staleness > 0
        and value("algorithm.correction") == "none"
        and not value("algorithm.allow_uncorrected")
    ):
        problems.append(
            Conflict(
                "an asynchronous run (buffer.max_staleness > 0) with algorithm.correction=none "
                "trains on stale data without correction; pick a correction (or start the run "
                "with algorithm.allow_uncorrected=true)"
            )
        )
    groups, learners = value("learner.groups_per_step"), value("learner.count")
    mini_batches = value("learner.mini_batches")
    if groups % learners != 0:
        problems.append(
            Conflict(
                f"learner.groups_per_step ({groups}) must be divisible by learner.count "
                f"({learners})"
            )
        )
    elif (groups // learners) % mini_batches != 0:
        problems.append(
            Conflict(
                f"learner.groups_per_step / learner.count ({groups} / {learners}) must be "
                f"divisible by learner.mini_batches ({mini_batches}): mini-batches hold whole "
                "groups"
            )
        )
    if not 0 <= value("algorithm.overlong_buffer.length") <= value("generator.max_new_tokens"):
        problems.append(
            Conflict("algorithm.overlong_buffer.length must be in [0, generator.max_new_tokens]")
        )
    return problems
