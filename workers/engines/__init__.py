"""Generation engines behind one interface (``base.Engine``), by name (``registry.ENGINES``:
``hf``, ``vllm``, ``sglang``, or a user's ``module:Class``).

``check_engine_config`` checks ``generator.engine`` and ``generator.engine_options`` without
importing torch (``streamrl validate``); ``check_engine`` also asks the engine whether it can
serve the model here (the launch, before any process starts); ``make_engine`` builds it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamrl.config import GeneratorConfig
from streamrl.workers.engines.base import Engine, EngineArgs, GenerationOutput, SamplingParams
from streamrl.workers.engines.registry import ENGINES, EngineKind, engine_options, resolve_engine

__all__ = [
    "ENGINES",
    "Engine",
    "EngineArgs",
    "EngineKind",
    "EngineUnavailable",
    "GenerationOutput",
    "SamplingParams",
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
