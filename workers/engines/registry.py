"""Engines by name (``generator.engine``), as environments are (``streamrl.envs``).

An engine is declared by an ``EngineKind``: its options (``generator.engine_options``, a msgspec
Struct checked when the config is; the built-ins' are in ``options``), what it supports, why it
cannot run here, and how to build it. ``ENGINES`` holds one line per built-in;
``generator.engine: module:Class`` names a user's ``EngineKind`` subclass instead.

    ENGINES["hf"].build(EngineArgs(model_dir, seed=1), HFOptions(max_batch_size=16))

This module and ``base`` import no torch: ``streamrl validate`` checks the engine's name and
options through them. The engines themselves (``hf``, ``vllm_engine``, ``sglang_engine``)
import torch, so each kind imports its engine only in ``build`` and ``unusable_reason``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, ClassVar

import msgspec

from streamrl.config import ConfigError
from streamrl.plugins import load_named
from streamrl.workers.engines.base import (
    SGLANG_INSTALL_HINT,
    VLLM_INSTALL_HINT,
    Engine,
    EngineArgs,
)
from streamrl.workers.engines.options import HFOptions, NoOptions, SGLangOptions, VLLMOptions


class EngineKind:
    """One engine as the registry knows it: class attributes and classmethods, no instances.
    A user's kind may sit beside its engine (``module:Class``; importing it may import torch);
    the built-ins' sit here, where the config check reads them without torch."""

    Options: ClassVar[type[msgspec.Struct]] = NoOptions
    # What the engine supports. stepwise: it calls ``on_step`` once per sampled token (an
    # update lands between two known tokens; SGLang calls it on a timer). seeded: a call with
    # ``SamplingParams.seed`` samples the same tokens again. lora: adapters (none yet).
    stepwise: ClassVar[bool] = False
    seeded: ClassVar[bool] = False
    lora: ClassVar[bool] = False

    @classmethod
    def unavailable_here(cls, device: str) -> str | None:
        """Why the engine cannot run on ``device`` on this machine whatever the model (not
        installed, no GPU), in one line naming what to do; None when it can. Imports no
        torch: ``streamrl validate`` asks it where no model directory is at hand."""
        return None

    @classmethod
    def unusable_reason(cls, model_dir: Path, device: str) -> str | None:
        """Why the engine cannot serve ``model_dir`` on ``device`` here (``unavailable_here``,
        or a model it lacks), in one line naming what to do; None when it can."""
        return cls.unavailable_here(device)

    @classmethod
    def build(cls, args: EngineArgs, options: Any) -> Engine:
        """The engine, with ``options`` an instance of ``cls.Options``."""
        raise NotImplementedError


class HF(EngineKind):
    """The project's transformers engine (``hf.py``), CPU or GPU."""

    Options = HFOptions
    stepwise = seeded = True

    @classmethod
    def build(cls, args: EngineArgs, options: HFOptions) -> Engine:
        from streamrl.workers.engines.hf import HFEngine

        return HFEngine(args, options)


class VLLM(EngineKind):
    """vLLM in the generator's process, stepped by it (``vllm_engine.py``)."""

    Options = VLLMOptions
    stepwise = seeded = True

    @classmethod
    def unavailable_here(cls, device: str) -> str | None:
        return VLLM_INSTALL_HINT if importlib.util.find_spec("vllm") is None else None

    @classmethod
    def unusable_reason(cls, model_dir: Path, device: str) -> str | None:
        import logging

        from streamrl.workers.engines import vllm_engine

        if (reason := cls.unavailable_here(device)) is not None:
            return reason
        # The model check imports vLLM in the launching process: keep its console quiet.
        logging.getLogger("vllm").setLevel(logging.ERROR)
        return vllm_engine.unsupported_reason(model_dir)

    @classmethod
    def build(cls, args: EngineArgs, options: VLLMOptions) -> Engine:
        from streamrl.workers.engines.vllm_engine import VLLMEngine

        return VLLMEngine(args, options)


class SGLang(EngineKind):
    """SGLang on one GPU (``sglang_engine.py``); ``on_step`` runs on a timer, and seeded
    sampling would need SGLang's deterministic-inference server mode."""

    Options = SGLangOptions

    @classmethod
    def unavailable_here(cls, device: str) -> str | None:
        if importlib.util.find_spec("sglang") is None:
            return SGLANG_INSTALL_HINT
        if not device.startswith("cuda"):
            return f"engine=sglang runs on a CUDA GPU (generator.device={device})"
        return None

    @classmethod
    def build(cls, args: EngineArgs, options: SGLangOptions) -> Engine:
        from streamrl.workers.engines.sglang_engine import SGLangEngine

        return SGLangEngine(
            str(args.model_dir), seed=args.seed, mem_fraction_static=options.mem_fraction_static
        )


ENGINES: dict[str, type[EngineKind]] = {"hf": HF, "vllm": VLLM, "sglang": SGLang}


def resolve_engine(name: str) -> type[EngineKind]:
    """The kind ``generator.engine`` names: a built-in, or a user's ``module:Class``."""
    if name in ENGINES:
        return ENGINES[name]
    if ":" in name:
        kind = load_named(name, "generator.engine")
        if not (isinstance(kind, type) and issubclass(kind, EngineKind)):
            raise ConfigError(
                f"generator.engine {name!r} is not a streamrl.workers.engines.EngineKind subclass"
            )
        return kind
    raise ConfigError(
        f"unknown generator.engine {name!r}: use one of {sorted(ENGINES)} or module:Class"
    )


def engine_options(kind: type[EngineKind], name: str, raw: dict[str, Any]) -> Any:
    """``generator.engine_options`` decoded by the engine's own schema, or one line saying
    which key is wrong."""
    try:
        return msgspec.convert(raw, kind.Options, strict=False)
    except msgspec.ValidationError as exc:
        message = str(exc)
        if message.startswith("Object contains unknown field"):
            key = message.split("`")[1]
            known = ", ".join(kind.Options.__struct_fields__) or "none"
            message = f"unknown key `generator.engine_options.{key}` (engine {name} takes: {known})"
        else:
            message = message.replace("`$.", "`generator.engine_options.").replace(
                "`$`", "`generator.engine_options`"
            )
        raise ConfigError(f"config error: {message}") from None
