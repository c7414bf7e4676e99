"""Generation engines behind one interface (``base.Engine``): ``hf`` and ``sglang``."""

from __future__ import annotations

from pathlib import Path

from streamrl.config import GeneratorConfig
from streamrl.workers.engines.base import Engine, GenerationOutput, SamplingParams

__all__ = ["Engine", "GenerationOutput", "SamplingParams", "make_engine"]


def make_engine(
    config: GeneratorConfig, model_dir: Path, seed: int, compute_dtype: str = "bfloat16"
) -> Engine:
    """The factory: the config names the engine; heavy imports happen only for the one used.
    ``compute_dtype`` is resolved already (``hardware.resolve_compute_dtype``); the weights
    are the bf16 image either way (an fp32 engine holds them upcast, exactly)."""
    if config.engine == "hf":
        from streamrl.workers.engines.hf import HFEngine

        return HFEngine(
            model_dir,
            device=config.device,
            dtype=compute_dtype,
            seed=seed,
            max_batch_size=config.max_batch_size,
        )
    if config.engine == "sglang":
        from streamrl.workers.engines.sglang_engine import SGLangEngine

        return SGLangEngine(str(model_dir), seed=seed)
    raise ValueError(f"unknown engine {config.engine!r}")
