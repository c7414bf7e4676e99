"""One rule per key, three readers: the config, the admin API and the buffer shard refuse the
same value of a key in the same words, because all three read the key's config field type
(``config.key_rule``); the rules between keys are one function that the config and the admin
API both call."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import msgspec
import pytest
import yaml

from streamrl.admin.live import PatchError, validate_patch
from streamrl.buffers.replay import ReplayPolicy, check_policy_value
from streamrl.config import ConfigError, key_rule, load_config, to_dict
from streamrl.config.key_rules import KeyRule
from streamrl.controller.knobs import LIVE_KEYS

# The keys more than one reader checks: every live key and every buffer shard policy field.
CHECKED_TWICE = set(LIVE_KEYS) | {f"buffer.{f.name}" for f in dataclasses.fields(ReplayPolicy)}

# A value each such key refuses; a new key without one fails the first test.
BAD: dict[str, Any] = {
    "buffer.capacity": 0,
    "buffer.capacity_tokens": 0,
    "buffer.max_staleness": -1,
    "buffer.sampling": "lifo",
    "buffer.max_reuse": 0,
    "buffer.overflow": "spill",
    "buffer.drop_zero_variance": "maybe",
    "generator.temperature": 0.0,
    "generator.prompts_per_call": 0,
    "generator.count": 1025,
}


def test_every_key_checked_twice_has_a_refused_example() -> None:
    assert set(BAD) == CHECKED_TWICE


def test_a_rule_reads_the_range_in_the_type() -> None:
    rule = KeyRule.of(Annotated[int, msgspec.Meta(ge=1)])
    assert (rule.problem(0), rule.problem(True), rule.problem(8)) == (
        "must be >= 1, got 0",
        "must be an integer, got True",
        None,
    )
    assert KeyRule.of(Annotated[float, msgspec.Meta(gt=0, le=1)]).wants == "in (0, 1]"
    zero = KeyRule.of(Annotated[int, msgspec.Meta(ge=0, extra={"zero": "off"})] | None)
    assert zero.wants == ">= 0 (0 = off) (or null)" and zero.problem(None) is None
    assert key_rule("rewards[0].judge.max_new_tokens").wants == ">= 1"


@pytest.mark.parametrize("key", sorted(BAD))
def test_config_admin_and_shard_refuse_the_same_value(key: str) -> None:
    rule, bad = key_rule(key), BAD[key]
    problem = rule.problem(bad)
    assert problem is not None and "\n" not in problem
    # Types the config's Struct already refuses (a bool, a choice) are msgspec's words there.
    typed_by_the_row = rule.kind in (int, float)

    with pytest.raises(ConfigError) as config_error:
        load_config(None, [f"{key}={yaml.safe_dump(bad).splitlines()[0]}"])
    assert key in str(config_error.value)
    if typed_by_the_row:
        assert str(config_error.value) == f"{key} {problem}"

    if key in LIVE_KEYS:
        with pytest.raises(PatchError) as patch_error:
            validate_patch({key: bad}, to_dict(load_config(None)))
        assert patch_error.value.status == 422
        (message,) = patch_error.value.problems
        assert message.startswith(f"{key}: ")
        if rule.kind is not bool:
            assert message == f"{key}: {problem}"

    section, field = key.split(".")
    if section == "buffer":
        with pytest.raises(ValueError) as shard_error:
            check_policy_value(field, bad)
        assert str(shard_error.value) == f"buffer setting {field!r} {problem}"


def test_the_defaults_pass_every_row() -> None:
    config = to_dict(load_config(None))
    for key in BAD:
        section, field = key.split(".")
        assert key_rule(key).problem(config[section][field]) is None, key


def test_a_rule_between_keys_reads_the_same_from_the_config_and_the_admin_api() -> None:
    with pytest.raises(ConfigError) as config_error:
        load_config(None, ["algorithm.correction=none", "buffer.max_staleness=1"])
    running = to_dict(load_config(None, ["algorithm.correction=none", "buffer.max_staleness=0"]))
    with pytest.raises(PatchError) as patch_error:
        validate_patch({"buffer.max_staleness": 1}, running)
    assert patch_error.value.status == 422
    assert patch_error.value.problems == [str(config_error.value)]
