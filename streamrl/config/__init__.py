"""Run configuration: one msgspec Struct per section, read strictly from YAML (docs/design.md §8).

Unknown or mistyped keys fail with the key's path. Command-line overrides are
``section.key=value``, the value read for the type of the key it sets (``parse_overrides``): a
string key takes the text as typed (``"data.answer_pattern=#### (.+)"``), any other reads it
as YAML (``3``, ``true``, ``[1, 2]``, ``1e-4``).

A key's range or choices are in its type (``Annotated[int, msgspec.Meta(ge=1)]``, a
``Literal``), refused in one line naming the key and the bound (``buffer.capacity must be >= 1,
got 0``); ``checks._finalize`` checks only the rules between keys. A key that moved or left is
refused by name unless it holds its old default, as a run directory's config.yaml from before
does (``MOVED_KEYS``, ``REMOVED_KEYS``).

Who changes a key: each section's docstring names its usual owner, the job author (what is
trained and how) or the operator (the machine it runs on, how it holds up); a field whose
comment opens with ``operator:`` or ``job author:`` belongs to the other.

The package's parts: ``base`` (strict sections, ``ConfigError``), ``sections`` (run, model,
data, env, generator, buffer, placement, admin, logging), ``rewards`` (``rewards:`` entries and
``scoring:``), ``training`` (learner, algorithm, weights, eval), ``schema`` (``Config`` and its
types read back), ``overrides``, ``checks`` (the rules between keys), ``loading`` (YAML and
overrides to a checked ``Config``) and ``key_rules`` (a key's rule read from its type, which
the buffer shard and the admin API check too).

This package is a leaf: stdlib, msgspec and yaml, its modules importing only each other.
``streamrl validate`` imports nothing else.
"""

from __future__ import annotations

from streamrl.config.base import ConfigError
from streamrl.config.checks import format_fields
from streamrl.config.loading import (
    MOVED_KEYS,
    MOVED_TASK_KEYS,
    OLD_SYSTEM_PROMPT,
    REMOVED_KEYS,
    default_config_path,
    launch_config,
    load_config,
    shipped_config,
)
from streamrl.config.overrides import APPEND, Override, parse_overrides, parse_with_overrides
from streamrl.config.rewards import SELF_TEACHER, JudgeSpec, RewardSpec, ScoringConfig, TeacherSpec
from streamrl.config.schema import Config, key_rule, to_dict, to_yaml
from streamrl.config.sections import (
    AdminConfig,
    BufferConfig,
    DataConfig,
    EnvConfig,
    GeneratorConfig,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    PlacementConfig,
    RunConfig,
    StalenessTuning,
)
from streamrl.config.training import (
    AlgorithmConfig,
    EvalConfig,
    KLConfig,
    LearnerConfig,
    OverlongConfig,
    WeightsConfig,
)

__all__ = [
    "APPEND",
    "AdminConfig",
    "AlgorithmConfig",
    "BufferConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "EnvConfig",
    "EvalConfig",
    "GeneratorConfig",
    "JudgeSpec",
    "KLConfig",
    "LearnerConfig",
    "LoggingConfig",
    "LoraConfig",
    "MOVED_KEYS",
    "MOVED_TASK_KEYS",
    "ModelConfig",
    "OLD_SYSTEM_PROMPT",
    "OverlongConfig",
    "Override",
    "PlacementConfig",
    "REMOVED_KEYS",
    "RewardSpec",
    "RunConfig",
    "SELF_TEACHER",
    "ScoringConfig",
    "StalenessTuning",
    "TeacherSpec",
    "WeightsConfig",
    "default_config_path",
    "format_fields",
    "key_rule",
    "launch_config",
    "load_config",
    "parse_overrides",
    "parse_with_overrides",
    "shipped_config",
    "to_dict",
    "to_yaml",
]
