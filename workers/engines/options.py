"""Each built-in engine's options (``generator.engine_options``), one msgspec Struct per engine.

Torch-free, and apart from ``registry``: the config check decodes them without importing an
engine, and the engines take them without importing the registry that builds them.
"""

from __future__ import annotations

from typing import Annotated

import msgspec


class NoOptions(msgspec.Struct, forbid_unknown_fields=True):
    """An engine without options."""


class HFOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # Rows decoded together; finished rows are refilled from the waiting prompts (continuous
    # batching). None = every prompt of a call at once.
    max_batch_size: Annotated[int, msgspec.Meta(ge=1)] | None = None
    # Linear layers prepacked for oneDNN (None: where it runs bf16; packed_linear.py), and
    # decode steps through FastDecoder (None: Llama-family models; fast_decode.py).
    prepack: bool | None = None
    fast_decode: bool | None = None
    # A version's changed elements written into a second copy of each parameter the weight
    # thread's image is not, so the adoption is a swap (spare_copies.py). None: on for an
    # fp32 engine on a CPU (AVX2), where it measured better; off for bf16 (only the
    # embedding and norms would take it; not measured better) and on a GPU (a model's worth
    # of its memory; not measured there yet). Off: the changed parameters made anew.
    spare_copies: bool | None = None


class VLLMOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # KV cache size (MiB); vLLM would otherwise reserve a share of all memory.
    kv_cache_mb: Annotated[int, msgspec.Meta(ge=1)] = 512
    # Sequences scheduled together (vLLM's max_num_seqs); None = 256.
    max_batch_size: Annotated[int, msgspec.Meta(ge=1)] | None = None


class SGLangOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # Share of the GPU's memory SGLang takes for weights and KV cache.
    mem_fraction_static: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.8
