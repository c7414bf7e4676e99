from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from streamrl.config import Config, ConfigError, load_config, parse_overrides, to_yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_shipped_configs_validate_and_open_with_a_comment(name: str) -> None:
    path = ROOT / "configs" / name
    assert path.read_text().startswith("#"), "each config opens with what it is for"
    assert isinstance(load_config(path), Config)


def test_unknown_key_names_its_path() -> None:
    with pytest.raises(ConfigError, match=r"unknown key `learner.lrr`"):
        load_config(None, ["learner.lrr=1"])
    with pytest.raises(ConfigError, match=r"unknown key `bogus`"):
        load_config(None, ["bogus=1"])


def test_mistyped_value_names_its_path() -> None:
    with pytest.raises(ConfigError, match=r"learner.lr"):
        load_config(None, ["learner.lr=fast"])


def test_overrides_parse_yaml_values() -> None:
    assert parse_overrides(["a.b=3", "c.d=true", "e.f=[1, 2]", "g.h=1e-4"]) == [
        ("a.b", 3),
        ("c.d", True),
        ("e.f", [1, 2]),
        ("g.h", 1e-4),
    ]
    with pytest.raises(ConfigError, match="expected section.key=value"):
        parse_overrides(["novalue"])


def test_sync_mode_is_zero_staleness_without_in_flight_updates() -> None:
    config = load_config(None, ["run.mode=sync", "buffer.max_staleness=3"])
    assert config.buffer.max_staleness == 0
    assert config.generator.in_flight_updates is False


def test_async_without_correction_is_refused_unless_allowed() -> None:
    with pytest.raises(ConfigError, match="allow_uncorrected"):
        load_config(None, ["algorithm.correction=none", "buffer.max_staleness=2"])
    load_config(None, ["algorithm.correction=none", "algorithm.allow_uncorrected=true"])
    load_config(None, ["algorithm.correction=none", "run.mode=sync"])


def test_groups_must_divide_across_learners() -> None:
    with pytest.raises(ConfigError, match="divisible"):
        load_config(None, ["learner.count=3", "learner.groups_per_step=4"])


def test_weights_verify_every_is_validated() -> None:
    assert load_config(None).weights.verify_every == 10
    assert load_config(None, ["weights.verify_every=0"]).weights.verify_every == 0  # off
    assert load_config(None, ["weights.verify_every=3"]).weights.verify_every == 3
    with pytest.raises(
        ConfigError, match=r"^weights.verify_every must be >= 0 \(0 = off\), got -1$"
    ):
        load_config(None, ["weights.verify_every=-1"])
    with pytest.raises(ConfigError, match=r"weights.verify_every") as info:
        load_config(None, ["weights.verify_every=often"])
    assert "\n" not in str(info.value)


def test_bf16_master_weights_warn_once_and_float32_stays_quiet(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="streamrl.config"):
        assert load_config(None).model.learner_dtype == "float32"  # the default, unchanged
        assert not caplog.records
        load_config(None, ["model.learner_dtype=bfloat16", "learner.lr=1e-5"])
    (record,) = caplog.records
    message = record.getMessage()
    assert record.levelno == logging.WARNING and "\n" not in message
    assert "model.learner_dtype=bfloat16" in message and "model.learner_dtype=float32" in message
    assert "learner.lr=1e-05" in message and "(0.0051)" in message


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [1, 2\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad)


def test_a_removed_key_is_refused_by_name_unless_at_its_old_default() -> None:
    """The staleness tuner's thresholds left the config; a run directory's config.yaml from
    before holds them at their defaults, and still loads."""
    removed = "`buffer.staleness_tuning.guard_ess` was removed"
    with pytest.raises(ConfigError, match=removed) as info:
        load_config(None, ["buffer.staleness_tuning.guard_ess=0.5"])
    assert "\n" not in str(info.value)
    old_default = load_config(None, ["run.name=r", "buffer.staleness_tuning.guard_ess=0.8"])
    assert old_default == load_config(None, ["run.name=r"])


def test_resolved_config_round_trips(tmp_path: Path) -> None:
    config = load_config(ROOT / "configs" / "tiny.yaml", ["learner.lr=0.5"])
    path = tmp_path / "resolved.yaml"
    path.write_text(to_yaml(config))
    assert load_config(path) == config


def _streamrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamrl.cli", *args], capture_output=True, text=True, cwd=ROOT
    )


@pytest.mark.slow  # a subprocess
def test_cli_bad_key_is_one_line_and_exit_2() -> None:
    result = _streamrl("validate", "configs/tiny.yaml", "learner.lrr=1")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "learner.lrr" in result.stderr


@pytest.mark.slow  # a subprocess
def test_help_and_validate_import_neither_torch_nor_ray() -> None:
    code = (
        "import sys; from streamrl.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "main(['validate', 'configs/tiny.yaml'])\n"
        "bad = [m for m in ('torch', 'ray', 'sglang', 'zmq') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_the_default_job_ships_with_the_package_and_runs_from_any_directory(
    tmp_path, monkeypatch
) -> None:
    """From a directory that is not the checkout, `streamrl launch` ran the code's built-in
    defaults (no format reward, group size 4, no dynamic sampling): a new user trained on
    reward 0. The job now ships as package data and is found wherever streamrl runs."""
    from pathlib import Path

    from streamrl.config import default_config_path, shipped_config

    checkout = Path(__file__).resolve().parents[2] / "configs"
    monkeypatch.chdir(tmp_path)
    path = default_config_path()
    assert path is not None and Path(path).read_text() == (checkout / "default.yaml").read_text()
    shipped = load_config(path)
    assert shipped.generator.group_size == 8 and shipped.buffer.drop_zero_variance
    assert load_config(None).generator.group_size != shipped.generator.group_size  # built-ins
    # A shipped job by name, from anywhere; a name that is no job stays an error.
    assert load_config("tiny").model.name == "tiny-random-llama"
    assert shipped_config("configs/tiny.yaml") == shipped_config("tiny.yaml")
    assert shipped_config("../pyproject") is None
    with pytest.raises(ConfigError, match="config file not found: nosuchjob"):
        load_config("nosuchjob")


@pytest.mark.parametrize(
    "overrides",
    [
        ["eval.every=10"],  # no checkpoints to take the best from
        ["eval.every=10", "run.checkpoint_every=4"],  # v10, v20 have none
        ["eval.every=0", "run.checkpoint_every=5"],  # no evaluations
    ],
)
def test_keep_best_needs_a_checkpoint_at_every_evaluation(overrides: list[str]) -> None:
    with pytest.raises(ConfigError, match="eval.keep_best exports the best evaluated version"):
        load_config(None, ["eval.keep_best=true", *overrides])


def test_keep_best_with_a_checkpoint_at_every_evaluation() -> None:
    config = load_config(None, ["eval.keep_best=true", "eval.every=10", "run.checkpoint_every=5"])
    assert config.eval.keep_best
