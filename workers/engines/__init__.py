"""Generation engines behind one interface (``base.Engine``): ``hf``, ``vllm`` and ``sglang``."""

from __future__ import annotations

from pathlib import Path

from streamrl.config import GeneratorConfig
from streamrl.workers.engines.base import Engine, GenerationOutput, SamplingParams

__all__ = [
    "Engine",
    "EngineUnavailable",
    "GenerationOutput",
    "SamplingParams",
    "check_engine",
    "make_engine",
]


class EngineUnavailable(RuntimeError):
    """The configured engine cannot run here; the message says why and what to do."""


def check_engine(config: GeneratorConfig, model_dir: Path) -> None:
    """Fail in one line before any process starts when the engine is not installed or
    cannot serve the model (the launch calls this)."""
    if config.engine == "vllm":
        import logging

        from streamrl.workers.engines import vllm_engine

        # The model check imports vLLM in the launching process: keep its console quiet.
        logging.getLogger("vllm").setLevel(logging.ERROR)

        try:
            vllm_engine.check_installed()
        except ImportError as exc:
            raise EngineUnavailable(str(exc)) from None
        reason = vllm_engine.unsupported_reason(model_dir)
        if reason is not None:
            raise EngineUnavailable(reason)
    elif config.engine == "sglang":
        import importlib.util

        from streamrl.workers.engines.sglang_engine import INSTALL_HINT

        if importlib.util.find_spec("sglang") is None:
            raise EngineUnavailable(INSTALL_HINT)


def make_engine(
    config: GeneratorConfig,
    model_dir: Path,
    seed: int,
    compute_dtype: str = "bfloat16",
    max_model_len: int = 2048,
    bind_host: str = "127.0.0.1",
) -> Engine:
    """The factory: the config names the engine; heavy imports happen only for the one used.
    ``compute_dtype`` is resolved already (``hardware.resolve_compute_dtype``); the weights
    are the bf16 image either way (an fp32 engine holds them upcast, exactly).
    ``max_model_len`` bounds prompt + response tokens (engines that reserve KV by length).
    ``bind_host`` (resolved) is where an engine that listens (vLLM's process groups) listens."""
    if config.engine == "hf":
        from streamrl.workers.engines.hf import HFEngine

        return HFEngine(
            model_dir,
            device=config.device,
            dtype=compute_dtype,
            seed=seed,
            max_batch_size=config.max_batch_size,
        )
    if config.engine == "vllm":
        from streamrl.workers.engines.vllm_engine import VLLMEngine

        return VLLMEngine(
            model_dir,
            device=config.device,
            dtype=compute_dtype,
            seed=seed,
            max_batch_size=config.max_batch_size,
            max_model_len=max_model_len,
            kv_cache_mb=config.kv_cache_mb,
            bind_host=bind_host,
        )
    if config.engine == "sglang":
        from streamrl.workers.engines.sglang_engine import SGLangEngine

        return SGLangEngine(str(model_dir), seed=seed)
    raise ValueError(f"unknown engine {config.engine!r}")
