"""The live knobs: one row per config key that may change while a run goes on.

A row names the key, its rule (range) and the roles it reaches; how a change reaches each role
is derived from the row, never written per key:

| role         | how the new value gets there                                            |
|--------------|-------------------------------------------------------------------------|
| `admission`  | ``policy.<field>`` set under ``state.lock``: the next admission decision |
| `shards`     | ``Reconfigure(<field>=value)`` to every shard, all or nothing           |
| `learners`   | ``LearnerActor.set_live(key, value)``: read at the next batch request    |
| `generators` | ``state.<field>`` rides on every ``AdmissionReply.<field>``: next call   |
| `supervisor` | the run's config: ``GeneratorPool.check`` acts on it within a second     |

``<field>`` is the key's last part (``buffer.max_staleness`` -> ``max_staleness``). Adding a
live knob is one row here (plus the field where its roles read it); ``tests/unit/
test_live_knobs.py`` proves each row reaches every role it names. Types come from the config
Structs; ``admin.live.validate_patch`` checks a patch against this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ROLES = ("admission", "shards", "learners", "generators", "supervisor")


@dataclass(frozen=True)
class LiveKey:
    key: str
    check: Callable[[Any], bool]
    rule: str  # what ``check`` demands, in words, for error messages and the docs
    reaches: tuple[str, ...]  # roles, from ROLES
    when: str  # when the change takes effect there, in words

    @property
    def field(self) -> str:
        return self.key.rsplit(".", 1)[1]

    @property
    def where(self) -> str:
        return f"{', '.join(self.reaches)}: {self.when}"


def _any(_: Any) -> bool:
    return True


LIVE_KEYS: dict[str, LiveKey] = {
    k.key: k
    for k in (
        LiveKey("buffer.capacity", lambda v: v >= 1, ">= 1", ("shards",), "next ingest"),
        LiveKey(
            "buffer.max_staleness",
            lambda v: v >= 0,
            ">= 0",
            ("admission", "shards", "learners"),
            "next admission request, next batch (eviction and the learners' floor)",
        ),
        LiveKey("buffer.sampling", _any, "", ("shards",), "next batch"),
        LiveKey("buffer.max_reuse", lambda v: v >= 1, ">= 1", ("shards",), "next batch"),
        LiveKey("buffer.overflow", _any, "", ("shards",), "next ingest"),
        LiveKey(
            "buffer.drop_zero_variance",
            _any,
            "",
            ("shards",),
            "next ingest (DAPO dynamic sampling)",
        ),
        LiveKey("generator.temperature", lambda v: v > 0, "> 0", ("generators",), "next call"),
        LiveKey(
            "generator.prompts_per_call",
            lambda v: v >= 1,
            ">= 1",
            ("generators",),
            "next call (prompts decoded concurrently)",
        ),
        LiveKey(
            "generator.count",
            lambda v: 1 <= v <= 1024,
            "in [1, 1024]",
            ("supervisor",),
            "within a second: new generators start and anchor; the highest ids retire after "
            "pushing what they were granted",
        ),
    )
}


def get_key(config: Any, dotted: str) -> Any:
    section, key = dotted.split(".", 1)
    return getattr(getattr(config, section), key)


def set_key(config: Any, dotted: str, value: Any) -> None:
    section, key = dotted.split(".", 1)
    setattr(getattr(config, section), key, value)
