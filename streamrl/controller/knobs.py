"""The live knobs: one row per config key that may change while a run goes on.

A row names the key and the roles it reaches. The key's rule (range or choices) is its
field's type in ``streamrl.config``, which the config and the torch-free buffer shard check as
well (``LiveKey.rule`` reads it; a row naming no config key fails at import). How a change
reaches each role is derived from the row, never written per key:

| role         | how the new value gets there                                            |
|--------------|-------------------------------------------------------------------------|
| `admission`  | the run's config, set under ``state.lock``; the policy reads it there    |
| `shards`     | ``Reconfigure(<field>=value)`` to every shard, all or nothing           |
| `learners`   | ``LearnerActor.set_live(key, value)``: read at the next batch request    |
| `generators` | ``state.<field>``, on ``AdmissionReply.directives.<field>``: next call   |
| `supervisor` | the run's config: ``GeneratorPool.check`` acts on it within a second     |

``<field>`` is the key's last part (``buffer.max_staleness`` -> ``max_staleness``). Adding a
live knob is one row here (its range is in its config field's type; plus the field where its
roles read it); ``tests/unit/test_live_knobs.py`` proves each row reaches every role it names.
Types come from the config Structs; ``admin.live.validate_patch`` checks a patch against this
table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamrl.config import key_rule
from streamrl.config.key_rules import KeyRule

ROLES = ("admission", "shards", "learners", "generators", "supervisor")


@dataclass(frozen=True)
class LiveKey:
    key: str
    reaches: tuple[str, ...]  # roles, from ROLES
    when: str  # when the change takes effect there, in words

    def __post_init__(self) -> None:
        try:
            self.rule  # noqa: B018 (a row naming no config key fails at import)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"live key {self.key}: no config field states its rule") from exc

    @property
    def rule(self) -> KeyRule:
        """The key's rule, read from its config field's type: what the config and the buffer
        shard check too."""
        return key_rule(self.key)

    @property
    def field(self) -> str:
        return self.key.rsplit(".", 1)[1]

    @property
    def where(self) -> str:
        return f"{', '.join(self.reaches)}: {self.when}"


LIVE_KEYS: dict[str, LiveKey] = {
    k.key: k
    for k in (
        LiveKey("buffer.capacity", ("shards",), "next ingest"),
        LiveKey(
            "buffer.max_staleness",
            ("admission", "shards", "learners"),
            "next admission request, next batch (eviction and the learners' floor)",
        ),
        LiveKey("buffer.sampling", ("shards",), "next batch"),
        LiveKey("buffer.max_reuse", ("shards",), "next batch"),
        LiveKey("buffer.overflow", ("shards",), "next ingest"),
        LiveKey("buffer.drop_zero_variance", ("shards",), "next ingest (DAPO dynamic sampling)"),
        LiveKey("generator.temperature", ("generators",), "next call"),
        LiveKey(
            "generator.prompts_per_call",
            ("generators",),
            "next call (prompts decoded concurrently)",
        ),
        LiveKey(
            "generator.count",
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
