"""FastDecoder: one decode step equals transformers' forward on the same cache, for Llama,
Mistral and Qwen2 (q/k/v biases), plain and with merged prepacked projections that follow
weight updates; the engine generates the same sequences with it as without it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from streamrl.hardware import cpu_bf16_is_fast
from streamrl.models import TINY, resolve_model
from streamrl.workers.engines.base import EngineArgs, SamplingParams
from streamrl.workers.engines.fast_decode import FastDecoder, rms_norm, unsupported_reason
from streamrl.workers.engines.hf import HFEngine
from streamrl.workers.engines.options import HFOptions

# Left-padded rows of different lengths: the key mask matters.
PROMPTS = [[1, 40, 41, 42, 43, 44, 45], [1, 50, 51], [1, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69]]


@pytest.fixture(scope="module")
def llama_dir() -> Path:
    return resolve_model(TINY)


def save_random_model(path: Path, model_class, config_class, **extra) -> Path:
    """A small random model of ``model_class`` saved to ``path``; q/k/v biases (where the
    architecture has them) drawn too, so that they count."""
    config = config_class(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        initializer_range=0.2,  # logits far from uniform, so a wrong step shows
        pad_token_id=0,
        **extra,
    )
    torch.manual_seed(0)
    model = model_class(config)
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                if proj.bias is not None:
                    proj.bias.normal_(0, 0.2)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("qwen2")
    return save_random_model(path, Qwen2ForCausalLM, Qwen2Config, use_sliding_window=False)


@pytest.fixture(scope="module")
def mistral_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mistral")
    return save_random_model(path, MistralForCausalLM, MistralConfig, sliding_window=None)


def decode_both_ways(engine: HFEngine, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token logits after prefilling PROMPTS then feeding ``tokens``: FastDecoder's step
    and transformers' forward, each on its own (identical) cache. Both must leave the same
    keys and values in their caches."""
    results, caches = [], []
    for fast in (True, False):
        cache, attention, lengths, _ = engine._prefill_distinct(PROMPTS)
        attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=-1)
        if fast:
            logits = engine._fast.step(tokens, attention, lengths, cache)
        else:
            logits = engine.model(
                input_ids=tokens[:, None],
                attention_mask=attention,
                position_ids=lengths[:, None],
                past_key_values=cache,
                use_cache=True,
            ).logits[:, -1]
        results.append(logits.float())
        caches.append(cache)
    for fast_layer, layer in zip(caches[0].layers, caches[1].layers, strict=True):
        torch.testing.assert_close(fast_layer.keys, layer.keys, atol=3e-2, rtol=0)
        torch.testing.assert_close(fast_layer.values, layer.values, atol=3e-2, rtol=0)
    return results[0], results[1]


@pytest.mark.parametrize("model", ["llama_dir", "qwen2_dir", "mistral_dir"])
def test_step_equals_transformers_forward_in_float32(model, request) -> None:
    engine = HFEngine(EngineArgs(request.getfixturevalue(model), dtype="float32"))
    assert engine._fast is not None
    fast, reference = decode_both_ways(engine, torch.tensor([3, 70, 9]))
    torch.testing.assert_close(fast, reference, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not cpu_bf16_is_fast(), reason="this CPU's oneDNN has no bf16 matmul")
@pytest.mark.parametrize("model", ["llama_dir", "qwen2_dir"])
def test_merged_packed_projections_follow_weight_updates(model, request) -> None:
    engine = HFEngine(EngineArgs(request.getfixturevalue(model)), HFOptions(prepack=True))
    merged = [g for layer in engine._fast.layers for g in (layer.qk_v, layer.gate_up)]
    assert all(g.packed is not None for g in merged)
    tokens = torch.tensor([3, 70, 9])
    fast, reference = decode_both_ways(engine, tokens)
    torch.testing.assert_close(fast, reference, atol=3e-2, rtol=0)  # bf16 rounding only

    # A version that changes every weight: the merged copies are rebuilt from the new ones
    # (without that the step would still compute the old q/k/v and gate/up).
    gen = torch.Generator().manual_seed(1)
    update = [
        (name, (p.float() + 0.1 * torch.randn(p.shape, generator=gen)).to(p.dtype))
        for name, p in engine.params.items()
    ]
    engine.update_weights(update, version=1)
    fast, reference = decode_both_ways(engine, tokens)
    torch.testing.assert_close(fast, reference, atol=3e-2, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_is_bit_equal_to_the_models(llama_dir, dtype) -> None:
    engine = HFEngine(
        EngineArgs(llama_dir, dtype="float32" if dtype == torch.float32 else "bfloat16")
    )
    norm = engine.model.model.layers[0].input_layernorm
    with torch.no_grad():
        norm.weight.normal_()
        x = (3 * torch.randn(16, norm.weight.shape[0])).to(dtype)
        assert torch.equal(rms_norm(x, norm), norm(x))


def test_engine_generates_the_same_sequences_with_and_without_it(llama_dir) -> None:
    prompts = PROMPTS + [[1, 70, 71, 72], [1, 80]]
    params = SamplingParams(temperature=1.0, max_new_tokens=10)
    outputs = []
    for fast in (True, False):
        # Two slots: rows join (left-padded) and leave the batch while decoding.
        engine = HFEngine(
            EngineArgs(llama_dir, dtype="float32", seed=4),
            HFOptions(max_batch_size=2, fast_decode=fast),
        )
        outputs.append(engine.generate(prompts, params))
    for fast, plain in zip(*outputs, strict=True):
        assert fast.response_ids == plain.response_ids
        torch.testing.assert_close(
            torch.tensor(fast.logprobs), torch.tensor(plain.logprobs), atol=1e-4, rtol=0
        )


def test_other_architectures_decode_through_transformers(tmp_path) -> None:
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64)
    GPT2LMHeadModel(config).save_pretrained(tmp_path)
    engine = HFEngine(EngineArgs(tmp_path, dtype="float32"))
    assert engine._fast is None
    assert "model_type 'gpt2'" in unsupported_reason(engine.model)
    with pytest.raises(ValueError, match="FastDecoder cannot run this model"):
        FastDecoder(engine.model, engine.params)
    outputs = engine.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_new_tokens=4))
    assert len(outputs[0].response_ids) == 4


def test_sliding_window_attention_decodes_through_transformers(tmp_path) -> None:
    path = save_random_model(tmp_path, MistralForCausalLM, MistralConfig, sliding_window=16)
    engine = HFEngine(EngineArgs(path, dtype="float32"))
    assert engine._fast is None
    assert "sliding-window" in unsupported_reason(engine.model)
