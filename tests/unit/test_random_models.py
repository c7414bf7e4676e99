"""The benchmark-size random models: architectures and name resolution, with no weights built.

The parameter counts are those of the published checkpoints (SmolLM2-135M: 134,515,008;
Llama-3.2-1B: 1,235,814,400), counted on the meta device so that nothing is allocated.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from streamrl import models
from streamrl.models import (
    RANDOM_MODELS,
    ModelNotFoundError,
    builtin,
    random_model_config,
    resolve_model,
)


def meta_params(name: str) -> int:
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**random_model_config(name)))
    return sum(p.numel() for p in model.parameters())


def test_random_smollm2_is_the_smollm2_135m_architecture() -> None:
    config = LlamaConfig(**random_model_config("random-smollm2-135m"))
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (
        576,
        1536,
        30,
    )
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (9, 3, 64)
    assert config.vocab_size == 49152 and config.max_position_embeddings == 8192
    assert config.rope_parameters["rope_theta"] == 100000.0 and config.rms_norm_eps == 1e-5
    assert config.tie_word_embeddings
    assert meta_params("random-smollm2-135m") == 134_515_008


def test_random_llama_1b_has_llama_3_2_1b_shapes() -> None:
    config = LlamaConfig(**random_model_config("random-llama-1b"))
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (
        2048,
        8192,
        16,
    )
    assert (config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (
        32,
        8,
        128256,
    )
    assert config.rope_parameters["rope_theta"] == 500000.0 and config.tie_word_embeddings
    assert meta_params("random-llama-1b") == 1_235_814_400


def test_special_ids_are_the_char_tokenizers() -> None:
    tokenizer = models.build_char_tokenizer()
    for name in RANDOM_MODELS:
        config = random_model_config(name)
        assert config["pad_token_id"] == tokenizer.pad_token_id
        assert (config["bos_token_id"], config["eos_token_id"]) == (
            tokenizer.bos_token_id,
            tokenizer.eos_token_id,
        )
        assert len(tokenizer) <= config["vocab_size"]  # the tokenizer's ids are all valid


def test_names_resolve_to_their_own_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[dict] = []

    def fake_build(out: Path, fields: dict) -> None:  # records the fields, builds no weights
        built.append(fields)
        (out / "config.json").write_text("{}")

    monkeypatch.setenv("STREAMRL_HOME", str(tmp_path))
    monkeypatch.setattr(builtin, "_build_random_llama", fake_build)
    for name in RANDOM_MODELS:
        assert resolve_model(name) == tmp_path / "models" / name
        assert resolve_model(name) == tmp_path / "models" / name  # cached: not rebuilt
    assert built == [random_model_config(name) for name in RANDOM_MODELS]


def test_unknown_names_say_what_exists() -> None:
    with pytest.raises(ModelNotFoundError, match="random-llama-1b"):
        random_model_config("random-llama-7b")
    with pytest.raises(ModelNotFoundError, match="random-smollm2-135m"):
        resolve_model("random-llama-7b")
