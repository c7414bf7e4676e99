"""SGLangEngine on a real GPU: generation, exact behaviour logprobs, in-flight weight updates.

Needs CUDA, the `sglang` extra and ``STREAMRL_SGLANG_MODEL`` (a small HF model directory or
an id in the local HF cache, e.g. Qwen/Qwen2.5-0.5B-Instruct); skips otherwise. The reference
for logprobs is the same checkpoint run with transformers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
import torch

from streamrl.workers.engines.base import Engine, SamplingParams

pytestmark = pytest.mark.gpu

MODEL = os.environ.get("STREAMRL_SGLANG_MODEL")
PROMPTS = [[100 + i, 200 + i, 300 + i, 400 + i] for i in range(8)]


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("sglang")
    if not MODEL:
        pytest.skip("set STREAMRL_SGLANG_MODEL to a small HF model")
    from streamrl.workers.engines.sglang_engine import SGLangEngine

    # No overlap scheduling: token versions are then exact at the update boundary.
    sglang_engine = SGLangEngine(MODEL, mem_fraction_static=0.3, disable_overlap_schedule=True)
    yield sglang_engine
    sglang_engine.shutdown()


@pytest.fixture(scope="module")
def reference(engine: Engine) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.bfloat16)
    return model.cuda().eval()


@torch.no_grad()
def reference_logprobs(
    model: torch.nn.Module, prompt: list[int], response: list[int], params: SamplingParams
) -> torch.Tensor:
    """log p(token) under softmax(logits / T), restricted to the top-k set and renormalised."""
    ids = torch.tensor([prompt + response], device="cuda")
    logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / params.temperature
    logp = logits.log_softmax(-1)
    if params.top_k > 0:
        kth = logp.topk(params.top_k, dim=-1).values[:, -1:]
        logp = logp.masked_fill(logp < kth, float("-inf")).log_softmax(-1)
    return logp.gather(1, torch.tensor(response, device="cuda")[:, None])[:, 0]


def test_generate_shapes_and_versions(engine: Engine) -> None:
    outs = engine.generate(PROMPTS, SamplingParams(max_new_tokens=16))
    assert len(outs) == len(PROMPTS)
    for out in outs:
        assert 1 <= len(out.response_ids) <= 16
        assert len(out.logprobs) == len(out.token_versions) == len(out.response_ids)
        assert set(out.token_versions) == {engine.version}
        assert all(lp <= 0.0 for lp in out.logprobs)
        assert out.finish_reason in ("stop", "length")


def test_greedy_logprobs_are_zero(engine: Engine) -> None:
    (out,) = engine.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_new_tokens=8))
    assert out.logprobs == [0.0] * len(out.response_ids)


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=0.8, max_new_tokens=32),
     SamplingParams(temperature=0.8, top_k=20, max_new_tokens=32)],
)  # fmt: skip
def test_behaviour_logprobs_match_reference(
    engine: Engine, reference: torch.nn.Module, params: SamplingParams
) -> None:
    for prompt, out in zip(PROMPTS, engine.generate(PROMPTS, params), strict=True):
        expected = reference_logprobs(reference, prompt, out.response_ids, params)
        got = torch.tensor(out.logprobs, device="cuda")
        assert (got - expected).abs().mean() < 0.05  # bf16 kernels differ slightly


def test_in_flight_update_splits_versions(engine: Engine, reference: torch.nn.Module) -> None:
    name, param = next(
        (n, p) for n, p in reference.named_parameters() if n.endswith("mlp.down_proj.weight")
    )
    before, started, updated = engine.version, time.monotonic(), []

    def on_step(eng: Engine) -> None:
        if not updated and time.monotonic() - started > 0.1:  # after some tokens
            eng.update_weights([(name, param.detach().cpu())], version=before + 1)
            updated.append(True)

    outs = engine.generate(PROMPTS, SamplingParams(max_new_tokens=512), on_step)
    assert updated and engine.version == before + 1
    for out in outs:
        assert out.token_versions == sorted(out.token_versions)
        assert set(out.token_versions) <= {before, before + 1}
    assert any(len(set(out.token_versions)) == 2 for out in outs)
    (after,) = engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=4))
    assert set(after.token_versions) == {before + 1}


def test_update_changes_and_restores_the_model(engine: Engine, reference: torch.nn.Module) -> None:
    params = dict(reference.named_parameters())
    if "model.norm.weight" not in params:
        pytest.skip("model has no model.norm.weight")
    norm = params["model.norm.weight"].detach().cpu()
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16)
    (original,) = engine.generate(PROMPTS[:1], greedy)
    # A zero final norm makes every logit 0, so greedy decoding picks token 0 every step.
    engine.update_weights([("model.norm.weight", torch.zeros_like(norm))], engine.version + 1)
    try:
        (zeroed,) = engine.generate(PROMPTS[:1], greedy)
        assert set(zeroed.response_ids) == {0}
    finally:
        engine.update_weights([("model.norm.weight", norm)], engine.version + 1)
    (restored,) = engine.generate(PROMPTS[:1], greedy)
    assert restored.response_ids == original.response_ids
