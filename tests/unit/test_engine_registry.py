"""The engine registry (``streamrl.workers.engines.registry``): names, ``module:Class``, each
engine's own options schema, the keys that moved into it, and one-line errors throughout.
No engine is built here (the contract suite builds every one)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from streamrl.cli import main as cli
from streamrl.config import ConfigError, load_config
from streamrl.workers.engines import ENGINES, EngineKind, check_engine_config
from streamrl.workers.engines.options import HFOptions, NoOptions
from streamrl.workers.engines.registry import HF

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"


class Counting(EngineKind):
    """A user's engine with options of its own (reached as ``test_engine_registry:Counting``)."""

    class Options(msgspec.Struct, forbid_unknown_fields=True):
        width: int = 1


def _check(*overrides: str):
    return check_engine_config(load_config(None, list(overrides)).generator)


def test_every_built_in_declares_its_options_and_what_it_supports() -> None:
    assert set(ENGINES) == {"hf", "vllm", "sglang"}
    for kind in ENGINES.values():
        assert issubclass(kind.Options, msgspec.Struct)
        assert kind.Options() == msgspec.convert({}, kind.Options)  # every option has a default
        assert not kind.lora
    assert [n for n, k in ENGINES.items() if k.stepwise and k.seeded] == ["hf", "vllm"]


def test_the_default_engine_and_its_options() -> None:
    assert _check() == (HF, HFOptions())
    assert _check("generator.engine_options.max_batch_size=16")[1] == HFOptions(max_batch_size=16)


def test_a_users_engine_by_module_and_class() -> None:
    kind, options = _check(
        "generator.engine=test_engine_registry:Counting", "generator.engine_options.width=3"
    )
    assert kind is Counting and options == Counting.Options(width=3)
    assert EngineKind.Options is NoOptions


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["generator.engine=vlm"], "unknown generator.engine 'vlm': use one of ['hf', 'sglang'"),
        (["generator.engine=os:path"], "is not a streamrl.workers.engines.EngineKind subclass"),
        (["generator.engine=no_such_module:X"], "generator.engine 'no_such_module:X' cannot be"),
        (
            ["generator.engine_options.kv_cache_mb=64"],
            "unknown key `generator.engine_options.kv_cache_mb` (engine hf takes: max_batch_size,",
        ),
        (
            ["generator.engine=vllm", "generator.engine_options.kv_cache_mb=0"],
            "Expected `int` >= 1 - at `generator.engine_options.kv_cache_mb`",
        ),
        (
            ["generator.engine_options.fast_decode=maybe"],
            "at `generator.engine_options.fast_decode`",
        ),
    ],
)
def test_a_wrong_engine_or_option_is_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _check(*overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("key", "new_place"),
    [
        ("max_batch_size=16", "generator.engine_options.max_batch_size"),
        ("kv_cache_mb=64", "generator.engine_options.kv_cache_mb"),
    ],
)
def test_an_engine_key_of_the_old_layout_names_its_new_place(key: str, new_place: str) -> None:
    with pytest.raises(ConfigError, match=f"moved: set {new_place}"):
        load_config(None, [f"generator.{key}"])


def test_a_run_directorys_config_from_before_the_move_still_loads(tmp_path: Path) -> None:
    """An older run's config.yaml holds every key at its default (streamrl eval, export and
    --resume read it): those defaults are the engines' too, so they load."""
    old = tmp_path / "config.yaml"
    old.write_text("generator:\n  max_batch_size: null\n  kv_cache_mb: 512\n")
    assert load_config(old).generator.engine_options == {}


def test_validate_refuses_an_unknown_engine_in_one_line_with_exit_2(capsys) -> None:
    # tests/unit/test_config.py checks that validate, engine check included, imports no torch.
    assert cli(["validate", str(TINY), "generator.engine=vlm"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "streamrl: unknown generator.engine 'vlm': use one of ['hf', 'sglang', 'vllm'] or "
        "module:Class"
    ]
