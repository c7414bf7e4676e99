"""Generation engines behind one interface (``base.Engine``), by name (``registry.ENGINES``:
``hf``, ``vllm``, ``sglang``, or a user's ``module:Class``).

``check_engine_config`` checks ``generator.engine`` and ``generator.engine_options`` without
importing torch (``streamrl validate``); ``check_engine`` also asks the engine whether it can
serve the model here (the launch, before any process starts); ``make_engine`` builds it, and
``build_engine`` builds a generator's (or its evaluation process's) from the run's config.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from streamrl.config import Config, GeneratorConfig
from streamrl.workers.engines.base import Engine, EngineArgs, GenerationOutput, SamplingParams
from streamrl.workers.engines.registry import ENGINES, EngineKind, engine_options, resolve_engine

log = logging.getLogger(__name__)

__all__ = [
    "ENGINES",
    "Engine",
    "EngineArgs",
    "EngineKind",
    "EngineUnavailable",
    "GenerationOutput",
    "SamplingParams",
    "build_engine",
    "check_engine",
    "check_engine_config",
    "make_engine",
]


class EngineUnavailable(RuntimeError):
    """The configured engine cannot run here; the message says why and what to do."""


def check_engine_config(config: GeneratorConfig) -> tuple[type[EngineKind], Any]:
    """The engine ``config`` names and its decoded options; ``ConfigError`` in one line for an
    unknown engine or an option its schema refuses."""
    kind = resolve_engine(config.engine)
    return kind, engine_options(kind, config.engine, config.engine_options)


def check_engine(config: GeneratorConfig, model_dir: Path) -> None:
    """Fail in one line before any process starts when the engine is unknown, its options are
    wrong, or it cannot serve the model here (the launch calls this)."""
    kind, _ = check_engine_config(config)
    reason = kind.unusable_reason(model_dir, config.device)
    if reason is not None:
        raise EngineUnavailable(reason)


def make_engine(
    config: GeneratorConfig,
    model_dir: Path,
    seed: int,
    compute_dtype: str = "bfloat16",
    max_model_len: int = 2048,
    bind_host: str = "127.0.0.1",
) -> Engine:
    """The engine the config names; heavy imports happen only for that one. ``compute_dtype``
    is resolved already (``hardware.resolve_compute_dtype``); ``bind_host`` too (see
    ``EngineArgs``)."""
    kind, options = check_engine_config(config)
    args = EngineArgs(
        Path(model_dir),
        device=config.device,
        dtype=compute_dtype,
        seed=seed,
        max_model_len=max_model_len,
        bind_host=bind_host,
    )
    return kind.build(args, options)


def build_engine(config: Config, model_dir: Path, generator_id: int, bind_host: str) -> Engine:
    """A generator's engine (or its evaluation process's), on the compute dtype resolved (and
    logged) once, long enough for the longest call it makes: training, evaluation or an
    episode turn."""
    # Imports torch, which this package does not at import time (``check_engine_config``).
    from streamrl.hardware import describe_choice, resolve_compute_dtype

    gen, requested = config.generator, config.model.compute_dtype
    compute = resolve_compute_dtype(requested, gen.device)
    log.info("generator[%d]: %s", generator_id, describe_choice(compute, requested, gen.device))
    longest = max(
        gen.max_new_tokens,
        config.eval.max_new_tokens or 0,
        config.env.max_tokens if config.env.name else 0,
    )
    return make_engine(
        gen,
        model_dir,
        seed=config.run.seed + generator_id,
        compute_dtype=compute,
        max_model_len=config.data.max_prompt_tokens + longest,
        bind_host=bind_host,  # the engine's own sockets (vLLM's process groups)
    )
