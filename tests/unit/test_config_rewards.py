"""``rewards:`` entries that are served (docs/design.md §7c): each bad one refused in one line
when the config loads; the resolved weights and normalisations are in the config."""

from __future__ import annotations

import pytest

from streamrl.config import ConfigError, load_config

JUDGE = "{judge: {model: tiny-random-llama}, weight: 0.5, normalize: group}"


def _load(rewards: str, *more: str):
    return load_config(None, [f"rewards=[{rewards}]", *more])


def test_a_rule_a_model_and_a_judge_load_with_their_weights_and_normalisations() -> None:
    config = _load(f"{{name: numeric_match}}, {{model: runs/rm, normalize: running}}, {JUDGE}")
    kinds = [(r.kind, r.weight, r.normalize, r.display_name()) for r in config.rewards]
    assert kinds == [
        ("rule", 1.0, "none", "numeric_match"),
        ("model", 1.0, "running", "rm-rm"),
        ("judge", 0.5, "group", "judge-tiny-random-llama"),
    ]
    assert [r.served for r in config.rewards] == [False, True, True]


@pytest.mark.parametrize(
    ("rewards", "message"),
    [
        ("{name: numeric_match, model: runs/rm}", "exactly one of name"),
        ("{weight: 2.0}", "exactly one of name"),
        ("{model: a/rm}, {model: b/rm}", "share a name; give one of them a label"),
        ("{judge: {model: m, template: 'Is it right?'}}", "must show the judge the response"),
        ("{judge: {model: m, number_range: [5, 1]}}", "low < high"),
        ("{model: runs/rm, normalize: sometimes}", "normalize"),
        ("{judge: {model: m, yes: [Yes]}}", "yes"),  # YAML reads `yes:` as a boolean key
    ],
)
def test_bad_served_rewards_are_refused_in_one_line(rewards: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        _load(rewards)
    assert "\n" not in str(caught.value)


def test_scoring_settings_are_checked_and_gpus_put_reward_roles_on_cuda() -> None:
    with pytest.raises(ConfigError, match="scoring.timeout_s must be > 0"):
        _load("{model: runs/rm}", "scoring.timeout_s=0")
    config = _load("{model: runs/rm}", "scoring.gpus_per_role=1")
    assert config.scoring.device == "cuda"
