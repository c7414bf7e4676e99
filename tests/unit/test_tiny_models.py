"""The small random models of ``streamrl.models.tiny``: each resolves by name to a directory
of its own architecture, keeps what sets that architecture apart from Llama, is built once,
and an engine that cannot serve one says so at launch, in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from streamrl.config import GeneratorConfig
from streamrl.models import TINY, ModelNotFoundError, build_char_tokenizer, resolve_model
from streamrl.models.tiny import ARCHITECTURES, ENGINES_SERVING
from streamrl.workers.engines import EngineUnavailable, check_engine
from streamrl.workers.engines.vllm_engine import streamed_names_not_in_checkpoint


def _config(name: str) -> dict:
    return json.loads((resolve_model(name) / "config.json").read_text())


def _tensors(name: str) -> list[str]:
    with safe_open(str(resolve_model(name) / "model.safetensors"), framework="pt") as f:
        return list(f.keys())


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_each_name_is_a_small_model_of_its_architecture(name: str) -> None:
    config = _config(name)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    assert head_dim == 32  # vLLM's CPU attention starts at 32
    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 64
    assert config["torch_dtype" if "torch_dtype" in config else "dtype"] == "bfloat16"
    tokenizer = build_char_tokenizer()
    assert (config["pad_token_id"], config["eos_token_id"]) == (
        tokenizer.pad_token_id,
        tokenizer.eos_token_id,
    )
    assert len(tokenizer) <= config["vocab_size"]
    assert "hf" in ENGINES_SERVING[name]


def test_each_keeps_what_sets_its_architecture_apart() -> None:
    archs = {name: _config(name)["architectures"] for name in ARCHITECTURES}
    assert archs == {
        "tiny-random-qwen2": ["Qwen2ForCausalLM"],
        "tiny-random-qwen3": ["Qwen3ForCausalLM"],
        "tiny-random-gemma3": ["Gemma3ForCausalLM"],
        "tiny-random-mistral": ["MistralForCausalLM"],
        "tiny-random-phi3": ["Phi3ForCausalLM"],
        "tiny-random-qwen3-moe": ["Qwen3MoeForCausalLM"],
    }
    assert "model.layers.0.self_attn.q_proj.bias" in _tensors("tiny-random-qwen2")
    assert "model.layers.0.self_attn.q_norm.weight" in _tensors("tiny-random-qwen3")
    gemma = _config("tiny-random-gemma3")
    assert set(gemma["layer_types"]) == {"sliding_attention", "full_attention"}
    assert gemma["sliding_window"] == 16 and gemma["tie_word_embeddings"]
    assert "lm_head.weight" not in _tensors("tiny-random-gemma3")  # tied
    phi3 = _tensors("tiny-random-phi3")
    assert "model.layers.0.self_attn.qkv_proj.weight" in phi3
    assert "model.layers.0.mlp.gate_up_proj.weight" in phi3
    moe = _config("tiny-random-qwen3-moe")
    assert (moe["num_local_experts"], moe["num_experts_per_tok"]) == (4, 2)
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in _tensors("tiny-random-qwen3-moe")
    assert "model.layers.1.mlp.gate.weight" in _tensors("tiny-random-qwen3-moe")  # the router


def test_built_once_and_the_same_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamrl.models import tiny

    first = resolve_model("tiny-random-qwen3")
    weights = (first / "model.safetensors").read_bytes()
    monkeypatch.setattr(tiny, "_build", lambda *a: pytest.fail("rebuilt"))
    assert resolve_model("tiny-random-qwen3") == first
    assert (first / "model.safetensors").read_bytes() == weights
    assert resolve_model(TINY) != first  # the tiny Llama is its own


def test_a_seeded_build_is_bit_identical(tmp_path: Path) -> None:
    from streamrl.models.tiny import _build, tiny_config

    model_type, fields = tiny_config("tiny-random-phi3")
    _build(tmp_path, model_type, fields)
    built = resolve_model("tiny-random-phi3") / "model.safetensors"
    assert (tmp_path / "model.safetensors").read_bytes() == built.read_bytes()


def test_an_unknown_tiny_name_is_not_found() -> None:
    with pytest.raises(ModelNotFoundError, match="tiny-random-gpt9.*tiny-random-qwen2"):
        resolve_model("tiny-random-gpt9")


def test_streamed_names_are_checkpoint_names_except_fused_experts() -> None:
    """transformers 5 fuses a MoE layer's experts into 3-D tensors on load (and splits them on
    save): what the learner streams names nothing of the checkpoint a vLLM engine holds."""
    for name in ARCHITECTURES:
        missing = streamed_names_not_in_checkpoint(resolve_model(name))
        if name == "tiny-random-qwen3-moe":
            assert missing == [
                f"model.layers.{i}.mlp.experts.{p}"
                for i in range(2)
                for p in ("gate_up_proj", "down_proj")
            ]
        else:
            assert missing == [], name
    assert streamed_names_not_in_checkpoint(resolve_model(TINY)) == []


def test_the_launch_refuses_what_vllm_cannot_serve_in_one_line() -> None:
    pytest.importorskip("vllm")
    for name in ARCHITECTURES:
        model_dir = resolve_model(name)
        if "vllm" in ENGINES_SERVING[name]:
            check_engine(GeneratorConfig(engine="vllm"), model_dir)
            continue
        with pytest.raises(EngineUnavailable, match="generator.engine=hf") as err:
            check_engine(GeneratorConfig(engine="vllm"), model_dir)
        assert "\n" not in str(err.value) and "experts" in str(err.value)
    assert [n for n in ARCHITECTURES if "vllm" not in ENGINES_SERVING[n]] == [
        "tiny-random-qwen3-moe"
    ]
    check_engine(GeneratorConfig(engine="hf"), resolve_model("tiny-random-qwen3-moe"))


def test_the_fused_decode_path_takes_the_llama_like_layers_only() -> None:
    """The HF engine's fused decode step (``fast_decode``) runs Qwen2 (q/k/v biases) and
    Mistral; every other architecture decodes through transformers' forward (the engine
    contract runs both kinds)."""
    from streamrl.models import load_causal_lm
    from streamrl.workers.engines.fast_decode import unsupported_reason

    fast = {n: unsupported_reason(load_causal_lm(resolve_model(n))) is None for n in ARCHITECTURES}
    assert fast == {
        "tiny-random-qwen2": True,
        "tiny-random-qwen3": False,
        "tiny-random-gemma3": False,
        "tiny-random-mistral": True,
        "tiny-random-phi3": False,
        "tiny-random-qwen3-moe": False,
    }


def test_the_hf_engine_batches_a_sliding_window_model_in_waves() -> None:
    """A sliding-window cache cannot take new rows beside running ones (``hf._Batch.join``):
    with fewer slots than prompts, the rows of Gemma3 join only an empty batch, and every
    prompt is answered as it is alone (greedy)."""
    from streamrl.workers.engines.base import EngineArgs, SamplingParams
    from streamrl.workers.engines.hf import HFEngine
    from streamrl.workers.engines.options import HFOptions

    args = EngineArgs(resolve_model("tiny-random-gemma3"), dtype="float32", seed=0)
    engine = HFEngine(args, HFOptions(max_batch_size=2))
    prompts = [[1, 5, 6] * k for k in range(1, 7)]
    # Many stop tokens: rows end at different steps while others still wait.
    params = SamplingParams(temperature=0.0, max_new_tokens=24, stop_token_ids=tuple(range(4, 40)))
    outputs = engine.generate(prompts, params)
    assert len({len(o.response_ids) for o in outputs}) > 1
    for prompt, out in zip(prompts, outputs, strict=True):
        (alone,) = engine.generate([prompt], params)
        assert out.response_ids == alone.response_ids
