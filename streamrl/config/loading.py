"""From a YAML file (or a shipped job's name) and overrides to a checked ``Config``
(``load_config``, ``launch_config``), with keys that moved or left refused by name and
msgspec's errors put in the words of the key."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import yaml

from streamrl.config.base import ConfigError
from streamrl.config.checks import _finalize
from streamrl.config.overrides import Override, _set_path, parse_overrides
from streamrl.config.schema import Config, key_rule
from streamrl.config.sections import StalenessTuning

log = logging.getLogger(__name__)


def shipped_config(name: str) -> Path | None:
    """A job that ships with streamrl (``configs/<name>.yaml``, package data of
    ``streamrl.configs``), by name (``tiny``, ``tiny.yaml`` or ``configs/tiny.yaml``); None if
    there is no such job."""
    from importlib import resources

    stem = name.removeprefix("configs/").removesuffix(".yaml")
    if not stem or "/" in stem or "\\" in stem:
        return None
    try:
        path = resources.files("streamrl.configs").joinpath(f"{stem}.yaml")
    except ModuleNotFoundError:  # an install without the shipped jobs
        return None
    return Path(str(path)) if path.is_file() else None


def default_config_path() -> str | None:
    """The default job (``configs/default.yaml``, shipped with the package): what ``streamrl
    launch`` and ``streamrl eval`` run without a config, from any directory. None only if the
    install lacks it (then the built-in defaults)."""
    path = shipped_config("default")
    return str(path) if path is not None else None


def _drop_task_args_of_a_replaced_source(
    tree: dict[str, Any], overrides: list[tuple[str, Any]]
) -> None:
    """``data.args`` are the arguments of the file's task: an override that gives another
    ``data.source`` (and no ``data.args`` of its own) leaves them behind, so that
    ``streamrl launch data.source=train.jsonl ...`` on the default job reads the table."""
    data = tree.get("data")
    keys = {key for key, _ in overrides}
    if not isinstance(data, dict) or "data.source" not in keys or "data.args" in keys:
        return
    source = next(value for key, value in reversed(overrides) if key == "data.source")
    if source != data.get("source"):
        data.pop("args", None)


def _name_bare_rewards(tree: dict[str, Any]) -> None:
    """``rewards: [gsm8k, my_rewards:brevity]`` (or ``rewards=[gsm8k]`` on the command line):
    a bare string in the list is a rule's name, as the Python API takes it."""
    rewards = tree.get("rewards")
    if isinstance(rewards, list):
        tree["rewards"] = [{"name": r} if isinstance(r, str) else r for r in rewards]


def load_config(
    path: str | Path | None = None, overrides: Sequence[Override] | None = None
) -> Config:
    """Read a YAML config (or the defaults), apply overrides (``parse_overrides``: text, or
    ``(key, value)`` pairs), decode strictly, validate."""
    tree: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            shipped = shipped_config(str(path))
            if shipped is None:
                raise ConfigError(f"config file not found: {path}")
            path = shipped  # a shipped job named from anywhere: `streamrl launch tiny`
        try:
            loaded = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML: {str(exc).splitlines()[0]}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
        tree = loaded or {}
    parsed = parse_overrides(overrides or [])
    _drop_task_args_of_a_replaced_source(tree, parsed)
    for key, value in parsed:
        _set_path(tree, key, value)
    _refuse_moved_keys(tree)
    _resolve_auto_staleness(tree)
    _name_bare_rewards(tree)
    run = tree.setdefault("run", {}) if isinstance(tree.get("run", {}), dict) else None
    if run is not None and not run.get("name"):
        stem = Path(path).stem if path is not None else "run"
        run["name"] = f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        config = msgspec.convert(tree, Config, strict=False)
    except msgspec.ValidationError as exc:
        out_of_range = _out_of_range(str(exc), tree)
        if out_of_range is not None:
            raise ConfigError(out_of_range) from None
        message = _pretty_validation(str(exc))
        raise ConfigError(f"config error: {message}{_set_by(message, overrides or [])}") from None
    return _finalize(config)


def launch_config(
    path: str | None, overrides: Sequence[Override], resume: str | None = None
) -> Config:
    """The config ``streamrl launch`` runs (and ``streamrl validate``, and ``streamrl.train``
    for a YAML or a job name): ``path``, a YAML file or a shipped job's name (the shipped
    default job when None), with ``overrides`` applied in order; with ``resume``, that run
    directory's own config.yaml, continued in place. ``ConfigError`` on one line for a config
    that cannot run."""
    overrides = list(overrides)
    if resume:
        run_dir = Path(resume)
        if path is not None:
            raise ConfigError("--resume uses the run's own config.yaml; pass overrides only")
        path = str(run_dir / "config.yaml")
        # Typed pairs: a directory's name is taken as it is, whatever it looks like to YAML.
        overrides = [
            ("run.output_dir", str(run_dir.parent)),
            ("run.name", run_dir.name),
            ("run.resume", True),
            *overrides,
        ]
    return load_config(path or default_config_path(), overrides)


def _set_by(message: str, overrides: Sequence[Override]) -> str:
    """`` (set by the override 'learner.lr=fast')`` when the key a validation message names
    came from a command-line override: the user sees what they typed beside what it needs."""
    at = re.search(r"at `([^`]+)`$", message)
    if at is None:
        return ""
    for item in reversed(overrides):
        key = item[0] if isinstance(item, tuple) else item.partition("=")[0]
        if at.group(1) == key or at.group(1).startswith((key + ".", key + "[")):
            return f" (set by the override {item!r})" if isinstance(item, str) else ""
    return ""


def _resolve_auto_staleness(tree: dict[str, Any]) -> None:
    """``buffer.max_staleness: auto`` -> ``staleness_tuning.auto`` on, the bound at its start
    (so a run directory's config.yaml holds a number and the tuning that moves it)."""
    buffer = tree.get("buffer")
    if not isinstance(buffer, dict) or buffer.get("max_staleness") != "auto":
        return
    tuning = buffer.setdefault("staleness_tuning", {})
    if not isinstance(tuning, dict):
        raise ConfigError("buffer.staleness_tuning must be a mapping")
    tuning["auto"] = True
    buffer["max_staleness"] = tuning.get("start", StalenessTuning().start)


# Keys that moved: where they live now, and the default they had. A run directory's
# config.yaml from before holds every key at its default: those load (the engine's options
# have the same defaults); a value that was set is refused, naming the new place.
MOVED_KEYS: dict[str, tuple[str, Any]] = {
    "generator.max_batch_size": (
        "generator.engine_options.max_batch_size (hf and vllm engines)",
        None,
    ),
    "generator.kv_cache_mb": ("generator.engine_options.kv_cache_mb (vllm engine)", 512),
}


# Keys that left (knobs only an experiment needed): what became of them, and the default they
# had. As with MOVED_KEYS, a run directory's config.yaml from before loads; a value that was set
# is refused, naming the key.
_TUNER_CONSTANT = "the staleness tuner's thresholds are constants (controller/staleness_tuner.py)"
REMOVED_KEYS: dict[str, tuple[str, Any]] = {
    "buffer.staleness_tuning.raise_when_learner_waits": (_TUNER_CONSTANT, 0.05),
    "buffer.staleness_tuning.raise_when_held": (_TUNER_CONSTANT, 0.05),
    "buffer.staleness_tuning.lower_when_learner_waits": (_TUNER_CONSTANT, 0.01),
    "buffer.staleness_tuning.guard_ess": (_TUNER_CONSTANT, 0.8),
    "buffer.staleness_tuning.guard_k3": (_TUNER_CONSTANT, 0.05),
    "weights.apply_in_background": (
        "a generator always prepares weights on a thread beside its engine (docs/design.md §4)",
        True,
    ),
}


# A built-in task's knobs, once keys of `data`, now its `data.args` (a run directory's
# config.yaml from before holds them all): old key -> its name in args, and its old default.
MOVED_TASK_KEYS: dict[str, tuple[str, Any]] = {
    "max_operand": ("max_operand", 20),
    "operations": ("operations", ["+", "-"]),
    "chain_terms": ("terms", 4),
    "countdown_numbers": ("numbers", 3),
    "countdown_max_target": ("max_target", 100),
    "question_template": ("question_template", "What is {a} {op} {b}?"),
    "question_templates": ("question_templates", []),
    "no_system_prompt_share": ("no_system_prompt_share", 0.0),
}
OLD_SYSTEM_PROMPT = "Answer with the number only."  # data.system_prompt's old default


def _move_task_keys(data: dict[str, Any]) -> None:
    """Old task keys of ``data`` into ``data.args`` (those set; defaults dropped), with a
    warning naming the new place. The old default system prompt, which only the arithmetic
    task read, becomes None (each task's own)."""
    old = [key for key in MOVED_TASK_KEYS if key in data]
    if not old:
        return
    args = data.setdefault("args", {})
    for key in old:
        name, default = MOVED_TASK_KEYS[key]
        value = data.pop(key)
        if value != default:
            args.setdefault(name, value)
            log.warning("config: data.%s moved to data.args.%s", key, name)
    if data.get("system_prompt") == OLD_SYSTEM_PROMPT:
        data["system_prompt"] = None


def _refuse_moved_keys(tree: dict[str, Any]) -> None:
    if isinstance(tree.get("data"), dict):
        _move_task_keys(tree["data"])
    for old, (new, default) in MOVED_KEYS.items():
        if _pop_path(tree, old, default) != default:
            raise ConfigError(f"config error: `{old}` moved: set {new}")
    for old, (why, default) in REMOVED_KEYS.items():
        if _pop_path(tree, old, default) != default:
            raise ConfigError(f"config error: `{old}` was removed: {why}")


def _pop_path(tree: dict[str, Any], dotted: str, missing: Any) -> Any:
    """Remove the key at ``dotted`` from ``tree`` and return its value (``missing`` if absent)."""
    *sections, key = dotted.split(".")
    node: Any = tree
    for section in sections:
        node = node.get(section) if isinstance(node, dict) else None
    return node.pop(key, missing) if isinstance(node, dict) else missing


_RANGE_ERROR = re.compile(r"Expected `(?:int|float)` [<>]=? .* - at `\$\.([^`]+)`")


def _out_of_range(message: str, tree: dict[str, Any]) -> str | None:
    """msgspec's ``Expected `int` >= 1 - at `$.buffer.capacity` `` in the words of the key's
    rule, ``buffer.capacity must be >= 1, got 0`` (the admin API's and the shard's words); None
    for any other message."""
    match = _RANGE_ERROR.fullmatch(message)
    if match is None:
        return None
    dotted = match.group(1)
    try:
        rule = key_rule(dotted)
        value: Any = tree
        for part in re.findall(r"\[\d+\]|[^.\[\]]+", dotted):
            value = value[int(part[1:-1])] if part.startswith("[") else value[part]
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return f"{dotted} {rule.refusal(value)}"


def _pretty_validation(message: str) -> str:
    # msgspec says "... - at `$.learner.lr`"; users think in `learner.lr`.
    unknown = re.match(r"Object contains unknown field `([^`]+)`(?: - at `\$\.?([^`]*)`)?", message)
    if unknown:
        key, section = unknown.groups()
        return f"unknown key `{section + '.' if section else ''}{key}`"
    message = message.replace("`$.", "`").replace("`$`", "`<root>`")
    if message.startswith("Expected `str` - at `key` in"):
        # YAML 1.1 reads yes/no/on/off/true/false keys as booleans, numbers as numbers.
        message += " (a key YAML reads as a boolean or a number: yes, no, on, off, 1; quote it)"
    return message
