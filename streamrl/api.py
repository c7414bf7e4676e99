"""``streamrl.train``: a run started from Python (a notebook, a script), without YAML or a shell,
on the same machinery as ``streamrl launch``.

Example (``ds`` a ``datasets.Dataset`` with a ``prompt`` and a ``reward_model.ground_truth``
per row, verl's layout; or any table ``data.source`` reads)::

    import streamrl

    def my_reward(sample: streamrl.RewardInput) -> float:
        return 1.0 if sample.response_text.strip() == sample.ground_truth else 0.0

    result = streamrl.train(
        model="tiny-random-llama",
        dataset=ds,
        rewards=[my_reward, "numeric_match", ("numeric_close", 0.5, {"scale": 5})],
        config={"run": {"max_steps": 3}, "generator": {"count": 1}},
        overrides=["learner.lr=1e-5"],
    )
    result.summary["version"], result.run_dir, result.final_eval

**The config** is read once, by ``config.load_config`` (what ``streamrl launch`` reads with),
from, in this order:

1. ``config``: None, the shipped default job (as ``streamrl launch`` with no config); a str or
   a path, a YAML file or a shipped job's name, ``"tiny"`` (``config.launch_config``, the
   CLI's own); a mapping, what a YAML file would hold, over the built-in defaults (dotted
   keys too: ``{"learner.lr": 1e-5}``); a ``Config``, as it is;
2. the arguments: ``model`` (``model.name``), ``rewards`` (the whole ``rewards:`` list: each a
   callable, a registered name or ``module:function``, or ``(name_or_callable, weight,
   args)``), ``dataset`` (``data.source``), ``env`` (``env.name``: a built-in name,
   ``module:Class`` or an ``Environment`` subclass; the rewards default to none then, an
   episode's reward being its environment's), ``name`` (``run.name``);
3. ``overrides``, as on the command line (``"learner.lr=1e-5"``).

A ``datasets.Dataset`` or ``DatasetDict`` (or a list of dicts, one per row, or a dict of
columns, made a ``Dataset`` at the door: ``as_dataset``) is saved with ``save_to_disk`` in the
run directory (``runs/<name>/dataset/``, ``controller.rundir.STAGED_DATASET``) and
``data.source`` names that directory, so ``config.yaml`` says what was trained on; a str or a
path is ``data.source`` itself (a file, a saved dataset, a hub id, a task name).

**How callables reach the roles**: each is registered in this process under a ``python:``
name (``streamrl.callables``) that the config holds (``rewards: [{name: python:my_reward}]``),
pickled by value with ``cloudpickle`` when it is a notebook's function or a closure, and sent
to every generator in its spec. Before anything starts, each one is pickled and then loaded
in a fresh process with the roles' environment: a callable that holds a socket, or whose
module only this process can import, fails here with a one-line ``ConfigError`` naming it.

**The run** is ``controller.run.launch``, in this process, as ``streamrl launch`` runs it: Ray
embedded on loopback (or the cluster at ``address``), each role a process of its own, this
process the controller. Its console lines (the run's layout, one line per learner step, each
evaluation, the outcome) go to ``console``, ``sys.stdout`` at the call: in a notebook they are
the cell's output as they come; a terminal also shows a progress bar (``metrics.MetricsLog``).
``train`` returns when the run ends: at ``run.max_steps``, by a stop rule (``eval.patience``,
``run.stop_when_starved_s``; ``RunResult.summary["stopped_because"]``) or stopped (a kernel
interrupt or Ctrl-C stops gracefully, a second one aborts with ``RunError``). Bad input raises
one line before any role starts: ``ConfigError``, or ``RunError``/``DataError``/
``ModelNotFoundError`` from the launch's pre-flight (``controller.preflight``, the checks
``streamrl validate`` runs).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import msgspec

from streamrl import callables
from streamrl.config import Config, ConfigError, Override, launch_config, load_config, to_dict

# A reward as ``train`` takes it: a callable (``RewardInput`` -> float), a registered name or
# ``module:function``, ``(name_or_callable, weight)`` or ``(name_or_callable, weight, args)``,
# or a mapping with the keys of a config's reward (``name``, ``weight``, ``args``,
# ``normalize``, ``label``; or ``model``/``judge``/``teacher`` instead of ``name``: a served
# reward model, judge or teacher, docs/design.md §7c, §7d).
RewardArg = Callable[..., float] | str | tuple[Any, ...] | Mapping[str, Any]


@dataclass(frozen=True)
class RunResult:
    """How a run ended. ``summary``: its ``summary.json``; ``final_eval``: the last held-out
    evaluation's record (``eval/*`` figures with the ``version`` evaluated), None without
    evaluations (``eval.every`` 0); ``config``: the config it ran, as in ``config.yaml``."""

    run_dir: Path
    summary: dict[str, Any]
    config: Config
    final_eval: dict[str, Any] | None

    @property
    def model_dir(self) -> Path:
        """The exported model (an HF directory)."""
        return self.run_dir / "hf"


def train(
    *,
    model: str | os.PathLike[str] | None = None,
    dataset: Any = None,
    rewards: Sequence[RewardArg] | None = None,
    config: Config | Mapping[str, Any] | str | os.PathLike[str] | None = None,
    overrides: Sequence[str] | str = (),
    env: type | str | None = None,
    name: str | None = None,
    address: str | None = None,
    console: TextIO | None = None,
) -> RunResult:
    """Run one job in this process and return how it ended (module doc: the config's
    sources and their order, callables, progress, errors)."""
    console = sys.stdout if console is None else console  # a notebook's, at the call
    dataset = as_dataset(dataset)
    served = [dict(item) for item in rewards or [] if _is_served(item)]
    parts = [_reward_parts(i, item) for i, item in enumerate(rewards or []) if not _is_served(item)]
    if env is not None and not isinstance(env, str | type):
        raise ConfigError(f"env: expected a name or an Environment class, got {env!r}")
    objects = [("reward", target) for target, _, _, _ in parts if not isinstance(target, str)]
    if isinstance(env, type):
        objects.append(("env", env))
    names = callables.register(objects)  # each one pickled: ConfigError if it cannot be
    labels = {names[id(obj)]: f"{what} {callables.label(obj)}" for what, obj in objects}

    extra: list[Override] = []
    if model is not None:
        extra.append(_override("model.name", os.fspath(model)))
    if rewards is not None or env is not None:
        named = [(t if isinstance(t, str) else names[id(t)], w, a, k) for t, w, a, k in parts]
        specs = [{"name": n, "weight": w, "args": a, **k} for n, w, a, k in named]
        extra.append(_override("rewards", _in_given_order(rewards or [], specs, served)))
    if env is not None:
        extra.append(_override("env.name", env if isinstance(env, str) else names[id(env)]))
    if name is not None:
        extra.append(_override("run.name", name))
    table = dataset is not None and not isinstance(dataset, str | os.PathLike)
    if dataset is not None and not table:
        extra.append(_override("data.source", _source_text(dataset)))
    tail = [overrides] if isinstance(overrides, str) else list(overrides)

    cfg = _load(config, extra, tail)
    from streamrl.controller.rundir import STAGED_DATASET, check_run_dir

    staged = None
    if table:
        _check_table(dataset)
        if cfg.run.resume:
            raise ConfigError(
                "dataset: a resumed run reads the data it started with (data.source); "
                "pass no dataset"
            )
        # Its directory is in the run's, whose name load_config chose: read again with
        # that name fixed and data.source naming it.
        staged = (Path(cfg.run.output_dir) / cfg.run.name / STAGED_DATASET).resolve()
        extra += [_override("run.name", cfg.run.name), _override("data.source", str(staged))]
        cfg = _load(config, extra, tail)
        if cfg.data.source != str(staged):  # an override of data.source came after it
            raise ConfigError("dataset= and a data.source override both name the prompts")
    check_run_dir(cfg)  # taken by an earlier run: refused before anything is written
    callables.check_loadable(callables.referenced(cfg), labels)
    if staged is not None:
        stage_dataset(dataset, staged)
    summary = _launch(cfg, address, console, staged)
    run_dir = Path(summary["run_dir"])
    written = json.loads((run_dir / "summary.json").read_text())
    evals = written.get("eval") or []
    return RunResult(run_dir, written, cfg, evals[-1] if evals else None)


def stage_dataset(dataset: Any, directory: Path) -> Path:
    """Write ``dataset`` (a ``datasets.Dataset`` or ``DatasetDict``) to ``directory`` with
    ``save_to_disk``, replacing what a failed earlier attempt left there."""
    _check_table(dataset)
    if directory.exists():
        shutil.rmtree(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    dataset.save_to_disk(str(directory))
    return directory


# ---------------------------------------------------------------------------- the parts


def _launch(cfg: Config, address: str | None, console: TextIO, staged: Path | None) -> dict:
    """``controller.run.launch``; this process's SIGTERM handler back afterwards (the
    controller's and Ray's replace it, which a CLI process never outlives, a kernel does);
    the staged dataset gone if the run never started (no ``config.yaml``)."""
    from streamrl.controller.run import launch

    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main else None
    try:
        return launch(cfg, address=address, console=console)
    except BaseException:
        if staged is not None and not (staged.parent / "config.yaml").exists():
            shutil.rmtree(staged, ignore_errors=True)
            if staged.parent.is_dir() and not any(staged.parent.iterdir()):
                staged.parent.rmdir()
        raise
    finally:
        if main and handler is not None:
            signal.signal(signal.SIGTERM, handler)


def _load(
    config: Config | Mapping[str, Any] | str | os.PathLike[str] | None,
    extra: list[Override],
    overrides: list[Override],
) -> Config:
    """The config from ``config``, then ``extra`` (the arguments), then ``overrides``."""
    if config is None or isinstance(config, str | os.PathLike):
        path = None if config is None else os.fspath(config)
        return launch_config(path, [*extra, *overrides])
    if isinstance(config, Config):
        tree: Mapping[str, Any] = to_dict(config)
    elif isinstance(config, Mapping):
        tree = config
    else:
        raise ConfigError(
            f"config: expected a YAML path, a job name, a mapping or a streamrl.Config, "
            f"got {type(config).__name__}"
        )
    # A mapping is a YAML file's contents: the same keys as overrides, so load_config applies
    # it exactly as it reads a file (no config file: the built-in defaults below it).
    return load_config(None, [*_tree_overrides(tree), *extra, *overrides])


def _tree_overrides(tree: Mapping[str, Any], prefix: str = "") -> list[Override]:
    """``{"run": {"max_steps": 3}}`` -> ``[("run.max_steps", 3)]``: a leaf, a list or an empty
    mapping is one override."""
    found = []
    for key, value in tree.items():
        if not isinstance(key, str) or not key or "=" in key:
            raise ConfigError(f"config: {prefix}{key!r} is not a key")
        if isinstance(value, Mapping) and value:
            found += _tree_overrides(value, f"{prefix}{key}.")
        else:
            found.append(_override(f"{prefix}{key}", value))
    return found


def _override(key: str, value: Any) -> tuple[str, Any]:
    """``(key, value)`` with the value as plain data (a path as its str), which
    ``parse_overrides`` takes as it is: a Python value never goes through text, so a string
    stays a string (``"5"``, ``"python:x"``) and a number a number."""
    try:
        plain = msgspec.to_builtins(value, enc_hook=_plain)
    except (TypeError, msgspec.EncodeError) as exc:
        raise ConfigError(f"config {key}: {exc}") from None
    return key, plain


def _plain(value: Any) -> Any:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"{type(value).__name__} {value!r} is not a config value")


def _is_served(item: RewardArg) -> bool:
    """A mapping naming a reward model, a judge or a teacher: the config checks it as it is."""
    return isinstance(item, Mapping) and ("model" in item or "judge" in item or "teacher" in item)


def _in_given_order(
    items: Sequence[RewardArg], rules: list[dict[str, Any]], served: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The rules' and the served rewards' specs back in the order the caller gave them."""
    rule_specs, served_specs = iter(rules), iter(served)
    return [next(served_specs) if _is_served(i) else next(rule_specs) for i in items]


def _reward_parts(index: int, item: RewardArg) -> tuple[Any, float, dict[str, Any], dict]:
    """(a name or a callable, weight, args, the other keys given) of one ``rewards`` item."""
    where = f"rewards[{index}]"
    extra: dict[str, Any] = {}
    if isinstance(item, Mapping):
        unknown = set(item) - {"name", "weight", "args", "normalize", "label"}
        if "name" not in item or unknown:
            raise ConfigError(
                f"{where}: expected the keys name, weight, args, normalize, label (or model, "
                f"judge or teacher for a served reward); got {sorted(item)}"
            )
        target, weight, args = item["name"], item.get("weight", 1.0), item.get("args", {})
        extra = {k: item[k] for k in ("normalize", "label") if k in item}
    elif isinstance(item, tuple):
        if not 1 <= len(item) <= 3:
            raise ConfigError(f"{where}: expected (name_or_callable, weight, args), got {item!r}")
        target, weight, args = (*item, *(None, 1.0, {})[len(item) :])
    else:
        target, weight, args = item, 1.0, {}
    if not isinstance(target, str) and not callable(target):
        raise ConfigError(f"{where}: expected a callable or a reward name, got {target!r}")
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise ConfigError(f"{where}: the weight must be a number, got {weight!r}")
    if not isinstance(args, Mapping):
        raise ConfigError(f"{where}: args must be a mapping of keyword arguments, got {args!r}")
    return target, float(weight), dict(args), extra


def _source_text(source: str | os.PathLike[str]) -> str:
    """``data.source`` for a str or a path: an existing local path made absolute (the roles'
    working directory need not be this process's), anything else as given (a task's name,
    a hub id)."""
    from streamrl.tasks import task_for

    text = os.fspath(source)
    local = task_for(text) is None and Path(text).exists()  # a task's name is never a path
    return str(Path(text).resolve()) if local else text


def as_dataset(dataset: Any) -> Any:
    """A list of rows (one dict each) or a dict of columns as a ``datasets.Dataset``
    (``Dataset.from_list``/``from_dict``), converted at the door; anything else as it is.
    ``ConfigError`` in one line for a list that is not all dicts, an empty one, or columns
    that do not make one table.

    Example: ``[{"question": "1 + 1?", "answer": "#### 2"}]`` -> a one-row ``Dataset``;
    ``{"question": ["1 + 1?"], "answer": ["#### 2"]}`` -> the same."""
    if type(dataset) not in (list, tuple, dict):
        return dataset  # a source's name, a Dataset, a DatasetDict (a dict subclass), ...
    if isinstance(dataset, dict):
        bad = [k for k, v in dataset.items() if not isinstance(v, list | tuple)]
        if not dataset or bad:
            got = f"column {bad[0]!r} is a {type(dataset[bad[0]]).__name__}" if bad else "none"
            raise ConfigError(f"dataset: a dict is a table's columns, each a list ({got})")
        lengths = {k: len(v) for k, v in dataset.items()}
        if len(set(lengths.values())) > 1:
            raise ConfigError(f"dataset: the columns differ in length ({lengths})")
        return _from(lambda ds: ds.Dataset.from_dict({k: list(v) for k, v in dataset.items()}))
    if not dataset:
        raise ConfigError("dataset: the list is empty: give one dict per row")
    for i, row in enumerate(dataset):
        if not isinstance(row, Mapping):
            raise ConfigError(
                f"dataset: a list is the table's rows, one dict each; item {i} is a "
                f"{type(row).__name__} ({_short(row)})"
            )
    return _from(lambda ds: ds.Dataset.from_list([dict(row) for row in dataset]))


def _from(build: Callable[[Any], Any]) -> Any:
    """``build(datasets)``, a failure to make one Arrow table as one line."""
    try:
        import datasets
    except ImportError:  # a dependency; a broken install still gets one line
        raise ConfigError("dataset: the datasets package cannot be imported") from None
    try:
        return build(datasets)
    except (ValueError, TypeError) as exc:  # pyarrow's ArrowInvalid/ArrowTypeError among them
        line = str(exc).strip().splitlines()
        raise ConfigError(
            f"dataset: the rows do not make one table: {line[0] if line else type(exc).__name__}"
        ) from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_table(dataset: Any) -> None:
    try:
        from datasets import Dataset, DatasetDict
    except ImportError:  # a dependency; a broken install still gets one line
        raise ConfigError("dataset: the datasets package cannot be imported") from None
    if not isinstance(dataset, Dataset | DatasetDict):
        raise ConfigError(
            "dataset: expected a datasets.Dataset or DatasetDict, a list of dicts (one per "
            f"row), a dict of columns, or data.source as a str or a path; got "
            f"{type(dataset).__name__} (an IterableDataset cannot be saved: build a Dataset, "
            "e.g. Dataset.from_generator)"
        )
