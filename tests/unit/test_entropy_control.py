"""The entropy coefficient's rule (streamrl.algorithms.entropy): fixed without a target, steered
towards the target with one, within [0, entropy_coef_max]."""

from __future__ import annotations

import pytest

from streamrl.algorithms.entropy import EntropyControl
from streamrl.config import ConfigError, load_config


def test_fixed_coefficient_ignores_the_measurement() -> None:
    control = EntropyControl(0.02)
    for entropy in (0.1, 5.0):
        control.update(entropy)
    control.restore(0.5)  # a fixed coefficient is the config's, whatever a checkpoint says
    assert control.value == 0.02 and not control.gated


def test_rises_below_the_target_and_decays_above_it() -> None:
    control = EntropyControl(0.0, target=1.0, step=0.01, max_coef=0.025)
    seen = []
    for entropy in (0.6, 0.6, 0.6, 0.6, 1.4, 1.4, 1.4, 1.4):
        control.update(entropy)
        seen.append(round(control.value, 6))
    # Capped at max on the way up, floored at 0 on the way down.
    assert seen == [0.01, 0.02, 0.025, 0.025, 0.015, 0.005, 0.0, 0.0]
    assert control.gated


def test_restore_keeps_the_bounds() -> None:
    control = EntropyControl(0.0, target=1.0, step=0.01, max_coef=0.05)
    control.restore(0.03)
    assert control.value == 0.03
    control.restore(7.0)
    assert control.value == 0.05


def test_a_start_above_the_cap_raises_the_cap() -> None:
    control = EntropyControl(0.2, target=1.0, step=0.01, max_coef=0.05)
    control.update(0.5)
    assert control.value == 0.2


@pytest.mark.parametrize(
    "override, words",
    [
        ("algorithm.entropy_target=0", "entropy_target"),
        ("algorithm.entropy_coef=-0.1", "entropy_coef"),
        ("algorithm.entropy_coef_step=-1", "entropy_coef_step"),
    ],
)
def test_the_config_refuses_out_of_range_values(override: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        load_config(None, [override])


def test_the_config_builds_the_control() -> None:
    config = load_config(None, ["algorithm.entropy_target=1.5", "algorithm.entropy_coef_max=0.2"])
    control = EntropyControl.from_config(config.algorithm)
    assert (control.target, control.step, control.max_coef, control.value) == (1.5, 0.005, 0.2, 0)
