"""The vLLM engine's pure parts (no vLLM needed) and its one-line refusals.

The engine's behaviour against a real vLLM is in tests/integration/test_engine_contract.py.
"""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from streamrl.config import ConfigError, GeneratorConfig, load_config
from streamrl.workers.engines import EngineUnavailable, check_engine, check_engine_config
from streamrl.workers.engines.base import SamplingParams
from streamrl.workers.engines.options import VLLMOptions
from streamrl.workers.engines.registry import VLLM
from streamrl.workers.engines.vllm_engine import (
    INSTALL_HINT,
    expand_to_layers,
    reload_failures,
    reload_groups,
    request_seeds,
    token_versions,
    vllm_sampling_kwargs,
)

LLAMA_PACKED = {
    "qkv_proj": ["q_proj", "k_proj", "v_proj"],
    "gate_up_proj": ["gate_proj", "up_proj"],
}
NAMES = [
    "model.embed_tokens.weight",
    *(
        f"model.layers.0.self_attn.{p}.{t}"
        for p in ("q_proj", "k_proj", "v_proj")
        for t in ("weight", "bias")
    ),
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.mlp.gate_proj.weight",
    "model.layers.0.mlp.up_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.layers.0.input_layernorm.weight",
    "model.layers.1.self_attn.q_proj.weight",
    "model.layers.1.self_attn.k_proj.weight",
    "model.layers.1.self_attn.v_proj.weight",
]


def test_a_fused_layer_reloads_from_all_of_its_parts() -> None:
    groups = reload_groups(NAMES, LLAMA_PACKED)
    qkv0 = [n for n in NAMES if n.startswith("model.layers.0.self_attn.") and "o_proj" not in n]
    assert groups["model.layers.0.self_attn.k_proj.bias"] == qkv0  # weights and biases
    assert groups["model.layers.0.mlp.up_proj.weight"] == [
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
    ]
    # Unfused modules and other layers stand alone.
    assert groups["model.layers.0.mlp.down_proj.weight"] == ["model.layers.0.mlp.down_proj.weight"]
    assert groups["model.embed_tokens.weight"] == ["model.embed_tokens.weight"]
    assert len(groups["model.layers.1.self_attn.q_proj.weight"]) == 3
    assert not set(groups["model.layers.1.self_attn.q_proj.weight"]) & set(qkv0)


def test_expanding_changed_names_adds_each_layer_once_in_order() -> None:
    groups = reload_groups(NAMES, LLAMA_PACKED)
    changed = [
        "model.layers.1.self_attn.v_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.1.self_attn.q_proj.weight",  # same layer as the first: not repeated
    ]
    assert expand_to_layers(changed, groups) == [
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.1.self_attn.k_proj.weight",
        "model.layers.1.self_attn.v_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
    ]
    assert expand_to_layers([], groups) == []


def test_version_spans_become_one_version_per_token() -> None:
    span = SimpleNamespace
    spans = [span(version="3", start=0, end=2), span(version="4", start=2, end=5)]
    assert token_versions(spans, 5) == [3, 3, 4, 4, 4]
    assert token_versions([span(version="2", start=0, end=9)], 2) == [2, 2]
    assert token_versions(None, 0) == []


@pytest.mark.parametrize(
    "spans",
    [
        None,  # tokens and no span at all
        [SimpleNamespace(version="4", start=1, end=3)],  # the first token uncovered
        [
            SimpleNamespace(version="3", start=0, end=1),
            SimpleNamespace(version="4", start=2, end=3),
        ],  # the middle token uncovered
        [SimpleNamespace(version="3", start=0, end=2)],  # the last token uncovered
    ],
    ids=["no-spans", "head", "gap", "tail"],
)
def test_a_token_no_version_span_covers_is_refused(spans) -> None:
    """As in the SGLang engine: a guessed version (the call's end version, before) would
    understate the token's staleness."""
    with pytest.raises(ValueError, match="do not cover 3 tokens"):
        token_versions(spans, 3)


def test_reload_failures_are_the_sent_layers_vllm_did_not_load() -> None:
    sent = [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.embed_tokens.weight",
    ]
    untouched = {"model.layers.1.self_attn.qkv_proj.weight", "model.norm.weight"}
    assert reload_failures(sent, untouched, LLAMA_PACKED) == []
    missed = untouched | {
        "model.layers.0.self_attn.qkv_proj.weight",
        "model.embed_tokens.weight",
    }
    assert reload_failures(sent, missed, LLAMA_PACKED) == [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.qkv_proj.weight",
    ]


def test_sampling_maps_to_vllm_with_neutral_penalties() -> None:
    params = SamplingParams(
        temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=5, stop_token_ids=(2,)
    )
    kw = vllm_sampling_kwargs(params, seed=11)
    assert kw["temperature"] == 0.7 and kw["top_k"] == 0 and kw["top_p"] == 0.9
    assert kw["max_tokens"] == 5 and kw["stop_token_ids"] == [2] and kw["ignore_eos"]
    assert kw["logprobs"] == 0 and kw["seed"] == 11 and kw["n"] == 1
    assert kw["repetition_penalty"] == 1.0 and kw["min_p"] == 0.0
    assert vllm_sampling_kwargs(SamplingParams(temperature=1e-7), seed=0)["temperature"] == 0.0


def test_request_seeds_follow_the_call_seed_or_the_engine_stream() -> None:
    assert request_seeds(3, 5, random.Random(0)) == request_seeds(3, 5, random.Random(1))
    assert len(set(request_seeds(4, 5, random.Random(0)))) == 4
    stream = random.Random(42)
    first, second = request_seeds(2, None, stream), request_seeds(2, None, stream)
    assert first != second and first == request_seeds(2, None, random.Random(42))


def test_config_accepts_vllm_and_its_options_and_refuses_an_unknown_engine() -> None:
    config = load_config(None, ["generator.engine=vllm", "generator.engine_options.kv_cache_mb=64"])
    kind, options = check_engine_config(config.generator)
    assert kind is VLLM and options == VLLMOptions(kv_cache_mb=64)
    with pytest.raises(ConfigError, match="generator.engine 'vlm'"):
        check_engine_config(load_config(None, ["generator.engine=vlm"]).generator)
    bad = load_config(None, ["generator.engine=vllm", "generator.engine_options.kv_cache_mb=0"])
    with pytest.raises(ConfigError, match="generator.engine_options.kv_cache_mb"):
        check_engine_config(bad.generator)


def test_launch_check_names_the_install_command_when_vllm_is_missing(monkeypatch, tmp_path) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    with pytest.raises(EngineUnavailable) as err:
        check_engine(GeneratorConfig(engine="vllm"), tmp_path)
    assert str(err.value) == INSTALL_HINT and "\n" not in str(err.value)
    assert "setup.sh --with-vllm" in str(err.value)


def test_launch_check_refuses_an_architecture_vllm_cannot_serve(tmp_path) -> None:
    pytest.importorskip("vllm")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["NoSuchForCausalLM"]}))
    with pytest.raises(EngineUnavailable, match="NoSuchForCausalLM") as err:
        check_engine(GeneratorConfig(engine="vllm"), tmp_path)
    assert "\n" not in str(err.value) and "generator.engine=hf" in str(err.value)


def test_launch_check_refuses_a_head_size_the_cpu_attention_lacks() -> None:
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform

    from streamrl.models import TINY, resolve_model

    if not current_platform.is_cpu():
        pytest.skip("the head-size rule is vLLM's CPU attention's")
    # The tiny test model has 4 heads of 16: vLLM's CPU kernels start at 32.
    with pytest.raises(EngineUnavailable, match="head_dim 16") as err:
        check_engine(GeneratorConfig(engine="vllm"), resolve_model(TINY))
    assert "\n" not in str(err.value) and "generator.engine=hf" in str(err.value)
    check_engine(GeneratorConfig(engine="vllm"), resolve_model(TINY, tiny_hidden=128))
