"""The whole config (``Config``, one field per section) and its types read back: the type of
the field at a dotted key (for overrides) and its rule (``key_rule``, for the admin API and the
buffer shard)."""

from __future__ import annotations

import re
import types
import typing
from functools import cache
from typing import Any

import msgspec
import yaml

from streamrl.config.base import _Section
from streamrl.config.key_rules import KeyRule
from streamrl.config.rewards import RewardSpec, ScoringConfig
from streamrl.config.sections import (
    AdminConfig,
    BufferConfig,
    DataConfig,
    EnvConfig,
    GeneratorConfig,
    LoggingConfig,
    ModelConfig,
    PlacementConfig,
    RunConfig,
)
from streamrl.config.training import AlgorithmConfig, EvalConfig, LearnerConfig, WeightsConfig

_UNKNOWN = object()  # a dotted key the schema does not have


class Config(_Section):
    run: RunConfig = msgspec.field(default_factory=RunConfig)
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    data: DataConfig = msgspec.field(default_factory=DataConfig)
    rewards: list[RewardSpec] = msgspec.field(
        default_factory=lambda: [RewardSpec(name="numeric_match")]
    )
    scoring: ScoringConfig = msgspec.field(default_factory=ScoringConfig)
    env: EnvConfig = msgspec.field(default_factory=EnvConfig)
    generator: GeneratorConfig = msgspec.field(default_factory=GeneratorConfig)
    buffer: BufferConfig = msgspec.field(default_factory=BufferConfig)
    learner: LearnerConfig = msgspec.field(default_factory=LearnerConfig)
    algorithm: AlgorithmConfig = msgspec.field(default_factory=AlgorithmConfig)
    weights: WeightsConfig = msgspec.field(default_factory=WeightsConfig)
    eval: EvalConfig = msgspec.field(default_factory=EvalConfig)
    placement: PlacementConfig = msgspec.field(default_factory=PlacementConfig)
    admin: AdminConfig = msgspec.field(default_factory=AdminConfig)
    logging: LoggingConfig = msgspec.field(default_factory=LoggingConfig)


def _members(kind: Any) -> tuple[Any, ...]:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return typing.get_args(kind)
    return (kind,)


@cache
def _hints(section: type) -> dict[str, Any]:
    return typing.get_type_hints(section)


def _field_type(dotted: str) -> Any:
    """The type of ``Config``'s field at ``dotted`` (``learner.lr`` -> float, ``data.args.x``
    -> Any); ``_UNKNOWN`` where the schema has no such key."""
    kind: Any = Config
    for part in dotted.split("."):
        sections = [m for m in _members(kind) if isinstance(m, type) and issubclass(m, _Section)]
        if len(sections) == 1:  # `LoraConfig | None` leads into LoraConfig
            kind = _hints(sections[0]).get(part, _UNKNOWN)
        elif typing.get_origin(kind) is dict:
            kind = typing.get_args(kind)[1]
        elif kind is not Any:
            return _UNKNOWN
        if kind is _UNKNOWN:
            return kind
    return kind


@cache
def key_rule(dotted: str) -> KeyRule:
    """The rule of the key at ``dotted`` (``buffer.capacity``, ``rewards[0].judge.max_new_tokens``),
    read from its field's type: what the admin API and the buffer shard check a value against,
    in the words the config refuses it with."""
    return KeyRule.of(_annotation_at(dotted))


def _annotation_at(dotted: str) -> Any:
    """The type of ``Config``'s field at a dotted path, ``Annotated`` ranges kept; ``[i]`` is
    an element of a list. ``KeyError`` where the schema has no such key."""
    kind: Any = Config
    for part in re.findall(r"\[\d+\]|[^.\[\]]+", dotted):
        if part.startswith("["):
            (kind,) = typing.get_args(kind)  # list[X]
            continue
        sections = [m for m in _members(kind) if isinstance(m, type) and issubclass(m, _Section)]
        if len(sections) != 1:
            raise KeyError(dotted)
        kind = typing.get_type_hints(sections[0], include_extras=True)[part]
    return kind


def to_yaml(config: Config) -> str:
    return yaml.safe_dump(msgspec.to_builtins(config), sort_keys=False)


def to_dict(config: Config) -> dict[str, Any]:
    return msgspec.to_builtins(config)
