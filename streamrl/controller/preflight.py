"""The pre-flight: every check a run makes of its input before any role starts, written once.

``streamrl validate``, ``streamrl launch`` and ``streamrl.train`` (through
``controller.run.launch``) all run ``preflight``, so ``validate`` passes what a launch would
start and refuses what it would refuse, with the same one-line message.

| what                                                        | refused with            |
|-------------------------------------------------------------|-------------------------|
| the data: source, mapping, splits, held-out rows disjoint   | ``DataError``,          |
| from training (``data.check_data``); the held-out prompts   | ``ConfigError``         |
| (``evaluation.eval_prompts``)                               |                         |
| rewards, the environment, the engine and its options        | ``ConfigError``         |
| the model and each served reward's model                    | ``ModelNotFoundError``  |
| the engine serves the model here; a LoRA adapter fits it    | ``ConfigError``         |
| the scoring device exists here; a teacher's tokenizer is    | ``ConfigError``         |
| the student's                                               |                         |
| the admin port is free; CPU pinning has cores to split      | ``RunError``            |
| the run directory is free, or for ``--resume`` is a run     | ``RunError``            |
| whose data and seed are the ones given                      |                         |

The checks read and write nothing in the run directory. ``resolve=False`` (``streamrl
validate``) builds and downloads no weights: a local model directory and a hub model's config
and tokenizer are checked (``models.check_model``), and a bare name must be a built-in's; a
built-in is not built, so where no model directory is at hand the two checks that need one
(the engine serving that model, an adapter fitting it) wait for the launch — whether the
engine runs on this machine at all is still checked — and only the adapter's
own settings are read (``tests/unit/test_preflight.py`` lists what the launch alone refuses).

Example::

    checked = preflight(config)          # the launch: a ModelNotFoundError, ... or
    checked.model_dir, checked.cores     # what the controller starts the roles with

This module imports no torch and no Ray: each check imports what it needs when it runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from streamrl.config import Config, ConfigError
from streamrl.models.store import ModelNotFoundError
from streamrl.tasks.base import DataError

# Bad input: ``streamrl validate``/``launch`` exit 2 on these; a ``RunError`` (a port or a
# run directory taken, a resume on other data) exits 1, as a run that cannot start.
BAD_INPUT: tuple[type[Exception], ...] = (ConfigError, DataError, ModelNotFoundError)


@dataclass(frozen=True)
class Checked:
    """What the pre-flight found that the launch starts the roles with.

    ``model_dir``: the policy's directory (None only under ``resolve=False`` for a built-in);
    ``scorer_dirs``: each served reward's model directory by its index in ``rewards``;
    ``cores``: ``placement.cpu_split``'s core sets (empty without pinning or on a cluster);
    ``data_line``: the row count of each side when both are tables, for the console."""

    model_dir: Path | None
    scorer_dirs: dict[int, str] = field(default_factory=dict)
    cores: dict[str, list[list[int]]] = field(default_factory=dict)
    data_line: str = ""


def preflight(
    config: Config,
    *,
    address: str | None = None,
    resolve: bool = True,
    available_cores: list[int] | None = None,
) -> Checked:
    """Run every check of the module doc's table on ``config``, in its order; return what
    they found or raise the first refusal (one line). ``address``: the Ray cluster the run
    joins (None: local, where CPU pinning applies); ``resolve``: download and build the
    models (the launch) or not (``streamrl validate``, module doc)."""
    from streamrl.controller.placement import check_port_free, cpu_split
    from streamrl.controller.rundir import check_resume_pinned, check_run_dir
    from streamrl.data import check_data
    from streamrl.envs import check_env
    from streamrl.evaluation import eval_prompts
    from streamrl.rewards import check_rewards
    from streamrl.workers.engines import check_engine_config

    sides = check_data(config)
    if config.eval.every > 0 or config.eval.before_train:
        eval_prompts(config)  # the held-out split exists and maps
    check_rewards(config.rewards)
    check_env(config.env)
    # Imports no torch (a user's module:Class aside).
    engine, _ = check_engine_config(config.generator)
    model_dir = _model_dir(config, resolve)
    if model_dir is not None:
        _check_engine(config, model_dir)
    elif (missing := engine.unavailable_here(config.generator.device)) is not None:
        raise ConfigError(missing)  # validate of a built-in: what this machine lacks
    scorer_dirs = _scorer_dirs(config, resolve, model_dir)
    if address is None:  # on a cluster the scoring device is a remote node's
        _check_scoring_device(config)
    _check_teachers(config, model_dir, scorer_dirs)
    _check_adapter(config, model_dir)
    check_port_free(config.admin.host, config.admin.port, "admin endpoint")
    cores_here = sorted(os.sched_getaffinity(0)) if available_cores is None else available_cores
    # Pinning is a local-mode affair: cores are per node.
    cores = cpu_split(config, cores_here) if address is None else {}
    check_run_dir(config)
    check_resume_pinned(config)  # a resume trains on the data and seed it started with
    return Checked(model_dir, scorer_dirs, cores, sides.line() if sides is not None else "")


def _model_dir(config: Config, resolve: bool) -> Path | None:
    from streamrl.models import resolve_model

    model = config.model
    if not resolve:  # a hub id's repo, revision, config and tokenizer; no weights
        return _look_at(model.name, revision=model.revision)
    return resolve_model(
        model.name,
        revision=model.revision,
        tiny_hidden=model.tiny_hidden,
        tiny_layers=model.tiny_layers,
    )


def _look_at(name: str, *, revision: str | None = None) -> Path | None:
    """``validate``'s check of a model name: ``check_model``, which leaves a bare name to the
    launch, then for a bare name no built-in has ``resolve_model``, which builds nothing for
    it and refuses it in the launch's own line. The checked directory, or None."""
    from streamrl.models import check_model, resolve_model

    checked = check_model(name, revision=revision)
    if checked is None and not _builds_as_builtin(name):
        resolve_model(name)
    return checked


def _builds_as_builtin(name: str) -> bool:
    """``name`` is a built-in that ``resolve_model`` would build, or a ``.gguf`` file it would
    convert: what ``validate`` does not do (module doc)."""
    from streamrl.models import GEMMA3, RANDOM_MODELS, SMOLLM2, TINY
    from streamrl.models.tiny import REWARD_MODEL, is_tiny

    builtin = name in (SMOLLM2, GEMMA3, TINY, REWARD_MODEL, *RANDOM_MODELS) or is_tiny(name)
    return builtin or Path(name).suffix == ".gguf"


def _scorer_dirs(config: Config, resolve: bool, model_dir: Path | None) -> dict[int, str]:
    """Served rewards' models (docs/design.md §7c): resolved (downloaded) once for the launch,
    checked as ``model.name`` is for ``validate``. A lagged teacher is the policy's."""
    if resolve and model_dir is not None:
        from streamrl.controller.reward_roles import resolve_scorer_models

        return resolve_scorer_models(config, model_dir)
    for reward in config.rewards:
        if reward.served and not reward.lagged_teacher:
            _look_at(reward.served_model)
    return {}


def _check_scoring_device(config: Config) -> None:
    """A served reward's device (``scoring.device``) exists on this machine."""
    device = config.scoring.device
    if device == "cpu" or not any(r.served for r in config.rewards):
        return
    import torch

    kind, _, index = device.partition(":")
    count = torch.cuda.device_count() if kind == "cuda" else 0
    if kind != "cuda" or count == 0 or (index and (not index.isdigit() or int(index) >= count)):
        raise ConfigError(
            f"scoring.device={device}: no such device here ({count} CUDA device(s)); "
            "serve the reward roles on cpu or on a GPU this machine has"
        )


def _check_teachers(config: Config, model_dir: Path | None, scorer_dirs: dict[int, str]) -> None:
    """A teacher scores the student's token ids: its vocabulary must be the student's, id
    for id (docs/design.md §7d). Checked where both directories are at hand."""
    if model_dir is None:
        return
    teachers = [
        i
        for i, r in enumerate(config.rewards)
        if r.kind == "teacher" and not r.lagged_teacher and i in scorer_dirs
    ]
    if not teachers:
        return
    from streamrl.models import load_tokenizer

    student = load_tokenizer(model_dir).get_vocab()
    for i in teachers:
        vocab = load_tokenizer(Path(scorer_dirs[i])).get_vocab()
        if vocab != student:
            differ = sum(vocab.get(token) != index for token, index in student.items())
            raise ConfigError(
                f"rewards[{i}].teacher: {config.rewards[i].teacher.model} has another "  # type: ignore[union-attr]
                f"tokenizer than the student {config.model.name} ({len(vocab)} tokens against "
                f"{len(student)}, {differ} of the student's with another id); a teacher "
                "must share the student's tokenizer"
            )


def _check_engine(config: Config, model_dir: Path) -> None:
    from streamrl.workers.engines import EngineUnavailable, check_engine

    try:
        check_engine(config.generator, model_dir)
    except EngineUnavailable as exc:  # bad input like any other: one line, exit 2
        raise ConfigError(str(exc)) from None


def _check_adapter(config: Config, model_dir: Path | None) -> None:
    """The adapter fits the model (its architecture on the meta device); without the model's
    directory (``validate`` of a built-in), the adapter's own settings only."""
    from streamrl.models.lora import adapter_settings, check_adapter, uses_lora

    if not uses_lora(config):
        return
    if model_dir is not None:
        check_adapter(config, model_dir)
    else:
        adapter_settings(config)
