"""The rule of one config key, read from its type, and the rules between keys.

A key's range or choices are part of its type in ``streamrl.config``
(``Annotated[int, msgspec.Meta(ge=1)]``, ``Literal["fifo", "random"]``): msgspec checks them
when the config loads, and ``KeyRule.of`` reads the same type back for the readers that check
one value on its own: the admin API (``admin.live.validate_patch``, a live patch) and the
buffer shard (``buffers.replay.check_policy_value``, a policy or a ``Reconfigure``). All three
refuse a number out of its range in the same words, ``<key> must be >= 1, got 0``, because they
read one fact, the field's type (``config.key_rule`` gives a key's rule).

Rules between keys (a batch that must divide across learners, staleness that needs a
correction) are one function, ``cross_key_problems``; the config and the admin API both call
it, the admin API with the patch applied.

This module imports only stdlib and msgspec: the rest of the config package (msgspec and yaml)
and the torch-free buffer shard both import it.

Example::

    rule = KeyRule.of(Annotated[int, Meta(ge=1)])
    rule.problem(0)      # "must be >= 1, got 0"
    rule.problem(True)   # "must be an integer, got True"
    rule.problem(8)      # None: allowed
    KeyRule.of(Annotated[int, Meta(ge=0, extra={"zero": "off"})]).wants   # ">= 0 (0 = off)"
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NamedTuple

import msgspec

# The choices of the choice keys, written once: the config Structs and the shard's policy
# annotate their fields with these.
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

    @classmethod
    def of(cls, annotation: Any) -> KeyRule:
        """The rule a field's type states: ``Annotated[int, Meta(ge=1)]`` (bounds ``ge``,
        ``gt``, ``le``, ``lt``; ``extra={"zero": "off"}`` says what 0 means), a ``Literal``'s
        choices, ``bool``, ``str``; ``X | None`` is X or null."""
        members = _union_members(annotation)
        nullable = type(None) in members
        inner = [m for m in members if m is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"no single-key rule in the type {annotation!r}")
        base, meta = inner[0], msgspec.Meta()
        if typing.get_origin(base) is Annotated:
            base, *extras = typing.get_args(base)
            meta = next((m for m in extras if isinstance(m, msgspec.Meta)), meta)
        if typing.get_origin(base) is Literal:
            allowed = typing.get_args(base)
            return cls(str, "one of " + "|".join(allowed), lambda v: v in allowed, nullable)
        if base is bool:
            return cls(bool, "true or false", lambda v: True, nullable)
        if base is str:
            return cls(str, "text", lambda v: True, nullable)
        if base not in (int, float):
            raise TypeError(f"no single-key rule in the type {annotation!r}")
        wants, in_range = _bounds(meta, "an integer" if base is int else "a number")
        zero = (meta.extra or {}).get("zero")
        wants += f" (0 = {zero})" if zero else ""
        return cls(base, wants + (" (or null)" if nullable else ""), in_range, nullable)

    def problem(self, value: Any) -> str | None:
        """None if ``value`` is allowed, else one line: ``must be <what>, got <value>``."""
        if value is None and self.nullable:
            return None
        if not self._has_kind(value):
            words = {int: "an integer", float: "a number"}.get(self.kind, self.wants)
            return f"must be {words}{' or null' if self.nullable else ''}, got {value!r}"
        if not self.in_range(value):
            return self.refusal(value)
        return None

    def refusal(self, value: Any) -> str:
        """The words for a value outside the range (the config's, when msgspec refused it)."""
        return f"must be {self.wants}, got {value!r}"

    def _has_kind(self, value: Any) -> bool:
        if isinstance(value, bool) or self.kind is bool:
            return isinstance(value, bool) and self.kind is bool
        if self.kind is float:
            return isinstance(value, int | float)  # a YAML or JSON 1 is a fine temperature
        return isinstance(value, self.kind)


def _union_members(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _bounds(meta: msgspec.Meta, unbounded: str) -> tuple[str, Callable[[Any], bool]]:
    """``meta``'s range in words (``>= 1``, ``in (0, 1]``) and as a test."""
    low = f"[{meta.ge}" if meta.ge is not None else f"({meta.gt}" if meta.gt is not None else ""
    high = f"{meta.le}]" if meta.le is not None else f"{meta.lt})" if meta.lt is not None else ""

    def in_range(v: Any) -> bool:
        return (
            (meta.ge is None or v >= meta.ge)
            and (meta.gt is None or v > meta.gt)
            and (meta.le is None or v <= meta.le)
            and (meta.lt is None or v < meta.lt)
        )

    if low and high:
        return f"in {low}, {high}", in_range
    if low:
        return f"{'>=' if low[0] == '[' else '>'} {low[1:]}", in_range
    if high:
        return f"{'<=' if high[-1] == ']' else '<'} {high[:-1]}", in_range
    return unbounded, in_range


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
