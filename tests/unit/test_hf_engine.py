"""HFEngine on the tiny random Llama: logprobs, stopping, in-flight updates, continuous batching.

References: a full forward over prompt + response (no cache, no padding) for the logprobs, and a
hand-driven cache for the in-flight update (old weights' keys/values, new weights' logits).
"""

from __future__ import annotations

import pytest
import torch

from streamrl.hardware import cpu_bf16_is_fast
from streamrl.models import TINY, resolve_model
from streamrl.protocol import pack_float32
from streamrl.workers.engines.base import EngineArgs, SamplingParams
from streamrl.workers.engines.hf import HFEngine, sample_tokens
from streamrl.workers.engines.options import HFOptions

PROMPTS = [[1, 40, 41, 42, 43, 44, 45], [1, 50, 51], [1, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69]]


@pytest.fixture(scope="module")
def model_dir():
    return resolve_model(TINY)


def full_forward_logprobs(engine: HFEngine, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log p(response[i] | prompt + response[:i]) from one uncached, unpadded forward (T=1)."""
    ids = torch.tensor([prompt + response])
    logits = engine.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def perturbed(engine: HFEngine, seed: int) -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        (name, (p.float() + 0.05 * torch.randn(p.shape, generator=gen)).to(torch.bfloat16))
        for name, p in engine.params.items()
    ]


def test_logprobs_are_those_of_the_sampled_distribution(model_dir) -> None:
    engine = HFEngine(EngineArgs(model_dir, seed=1))
    outputs = engine.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=12))
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        assert len(out.response_ids) == len(out.logprobs) == len(out.token_versions) > 0
        reference = full_forward_logprobs(engine, prompt, out.response_ids)
        torch.testing.assert_close(torch.tensor(out.logprobs), reference, atol=0.01, rtol=0)
        # The wire's float32 bytes come from the sampling tensor and hold the same values.
        assert out.logprobs_f32 and out.logprob_bytes() == pack_float32(out.logprobs)


def test_sample_tokens_truncates_and_renormalises() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    for _ in range(20):
        tok, lp = sample_tokens(logits, SamplingParams(top_k=2))
        assert int(tok) in (0, 1)
        assert float(lp) == pytest.approx(float(torch.log(torch.tensor([0.5, 0.3])[tok] / 0.8)))
        # top-p 0.7: 0.5 < 0.7 keeps token 1 too, 0.8 >= 0.7 drops the rest.
        tok, lp = sample_tokens(logits, SamplingParams(top_p=0.7))
        assert int(tok) in (0, 1)
        assert float(lp) == pytest.approx(float(torch.log(torch.tensor([0.5, 0.3])[tok] / 0.8)))
        tok, lp = sample_tokens(logits * 0.5, SamplingParams(temperature=0.5))
        assert float(lp) == pytest.approx(float(torch.log_softmax(logits[0], -1)[tok]), abs=1e-5)
    tok, lp = sample_tokens(logits, SamplingParams(temperature=0.0))
    assert int(tok) == 0 and float(lp) == 0.0


def test_stop_token_ends_the_sequence_and_max_tokens_caps_it(model_dir) -> None:
    engine = HFEngine(EngineArgs(model_dir))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    (free,) = engine.generate([PROMPTS[0]], greedy)
    assert len(free.response_ids) == 10 and free.finish_reason == "length"
    # The last token that appears for the first time: stopping on it cuts the response there.
    stop_at = max(i for i, t in enumerate(free.response_ids) if t not in free.response_ids[:i])
    stop_token = free.response_ids[stop_at]
    params = SamplingParams(temperature=0.0, max_new_tokens=10, stop_token_ids=(stop_token,))
    (stopped,) = engine.generate([PROMPTS[0]], params)
    assert stopped.response_ids == free.response_ids[: stop_at + 1]
    assert stopped.finish_reason == "stop"
    (short,) = engine.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_new_tokens=3))
    assert short.response_ids == free.response_ids[:3] and short.finish_reason == "length"


def test_in_flight_update_continues_the_sequence_with_new_versions(model_dir) -> None:
    engine = HFEngine(EngineArgs(model_dir))
    old = {name: p.detach().clone() for name, p in engine.params.items()}
    new = perturbed(engine, seed=7)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    (before,) = engine.generate([PROMPTS[0]], greedy)

    steps = []

    def on_step(eng) -> None:
        steps.append(len(steps))
        if len(steps) == 3:  # three tokens sampled so far
            eng.update_weights(new, version=1)

    (out,) = engine.generate([PROMPTS[0]], greedy, on_step)
    assert out.token_versions == [0, 0, 0] + [1] * 5
    assert len(out.response_ids) == 8
    assert out.response_ids[:3] == before.response_ids[:3]  # the same sequence, continued

    # Reference for token 3: keys/values of prompt + tokens 0..1 from the old weights, then
    # token 2 fed through the new weights (no recompute of the cache).
    from transformers import DynamicCache

    engine.update_weights(list(old.items()), version=0)
    cache = DynamicCache(config=engine.model.config)
    engine.model(input_ids=torch.tensor([PROMPTS[0] + out.response_ids[:2]]), past_key_values=cache)
    engine.update_weights(new, version=1)
    logits = engine.model(input_ids=torch.tensor([[out.response_ids[2]]]), past_key_values=cache)
    assert int(logits.logits[0, -1].argmax()) == out.response_ids[3]


def test_continuous_batching_refills_slots(model_dir) -> None:
    prompts = PROMPTS + [[1, 70, 71, 72], [1, 80]]
    alone = HFEngine(EngineArgs(model_dir))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    solo = [alone.generate([p], greedy)[0].response_ids for p in prompts]
    # Stop tokens that end sequences at different steps, so slots free up unevenly.
    stop = (solo[0][2], solo[1][5])
    expected = []
    for ids in solo:
        end = next((i + 1 for i, t in enumerate(ids) if t in stop), len(ids))
        expected.append(ids[:end])
    assert len({len(e) for e in expected}) > 1

    engine = HFEngine(EngineArgs(model_dir), HFOptions(max_batch_size=2))
    # (rows, prompt width) of each prefill (the model's forward) and (rows, 0) of each decode
    # step (`_decode`: FastDecoder's step, or a forward of one token per row, also logged).
    forwards: list[tuple[int, int]] = []
    engine.model.register_forward_pre_hook(
        lambda _m, _a, kw: forwards.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    decode = engine._decode
    engine._decode = lambda batch, tokens: (
        forwards.append((len(tokens), 0)) or decode(batch, tokens)
    )
    params = SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=stop)
    outputs = engine.generate(prompts, params)
    assert [o.response_ids for o in outputs] == expected
    assert [o.finish_reason for o in outputs] == [
        "stop" if len(e) < 12 else "length" for e in expected
    ]
    assert max(rows for rows, _ in forwards) == 2
    first_decode = next(i for i, (_, width) in enumerate(forwards) if width == 0)
    assert any(width > 1 for _, width in forwards[first_decode:]), "no slot was refilled"

    # Sampled, refilled rows still record the logprobs of the distribution they sampled from.
    engine.generator.manual_seed(5)
    sampled = engine.generate(prompts, SamplingParams(max_new_tokens=9, stop_token_ids=stop))
    for prompt, out in zip(prompts, sampled, strict=True):
        reference = full_forward_logprobs(engine, prompt, out.response_ids)
        torch.testing.assert_close(torch.tensor(out.logprobs), reference, atol=0.01, rtol=0)
        assert out.logprobs_f32 == pack_float32(out.logprobs)  # rows regrouped per sequence


def test_a_common_prefix_is_prefilled_once_and_changes_nothing(model_dir) -> None:
    """Prompts sharing a long prefix (a chat template with its system prompt): the prefix is
    one single-row forward, each prompt's rest (of several lengths, so shorter rests leave a
    hole of padding between prefix and rest) a second, and every output is the one the prompt
    gets alone: the same greedy tokens, logprobs of the sampled distribution."""
    prefix = [1] + list(range(30, 49))  # 20 tokens, shared by 8 prompts: 140 positions spared
    rests = [[60 + i] * (1 + i % 4) for i in range(8)]
    prompts = [prefix + rest for rest in rests]
    engine = HFEngine(EngineArgs(model_dir, dtype="float32"))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    solo = [engine.generate([p], greedy)[0].response_ids for p in prompts]
    widths: list[tuple[int, int]] = []
    hook = engine.model.register_forward_pre_hook(
        lambda _m, _a, kw: widths.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    together = engine.generate(prompts + prompts[:2], greedy)  # two prompts asked twice
    hook.remove()
    assert widths[:2] == [(1, len(prefix)), (8, 4)]  # prefix once, then 8 distinct rests
    assert [o.response_ids for o in together] == solo + solo[:2]

    engine.generator.manual_seed(3)
    sampled = engine.generate(prompts, SamplingParams(max_new_tokens=6))
    for prompt, out in zip(prompts, sampled, strict=True):
        reference = full_forward_logprobs(engine, prompt, out.response_ids)
        torch.testing.assert_close(torch.tensor(out.logprobs), reference, atol=1e-4, rtol=0)


@pytest.mark.skipif(not cpu_bf16_is_fast(), reason="this CPU's oneDNN has no bf16 matmul")
def test_prepacked_layers_compute_the_plain_model_and_follow_updates(model_dir) -> None:
    packed, plain = (
        HFEngine(EngineArgs(model_dir), HFOptions(prepack=True)),
        HFEngine(EngineArgs(model_dir), HFOptions(prepack=False)),
    )
    assert packed._packed and not plain._packed
    ids = torch.tensor([PROMPTS[2]])

    def logits(engine: HFEngine) -> torch.Tensor:
        return engine.model(input_ids=ids).logits.float()

    torch.testing.assert_close(logits(packed), logits(plain), atol=2e-2, rtol=0)
    new = perturbed(plain, seed=3)
    for engine in (packed, plain):
        engine.update_weights(new, version=1)
    torch.testing.assert_close(logits(packed), logits(plain), atol=2e-2, rtol=0)
    # The shared image: a subscriber writes into the parameters, then names what it changed.
    name = "lm_head.weight" if "lm_head.weight" in packed.params else "model.embed_tokens.weight"
    for engine in (packed, plain):
        engine.params[name].data.mul_(-1)
        engine.update_weights([(name, engine.params[name].data)], version=2)
    torch.testing.assert_close(logits(packed), logits(plain), atol=2e-2, rtol=0)


def test_spare_copies_are_on_for_an_fp32_cpu_engine_unless_set(model_dir) -> None:
    """An fp32 CPU engine takes versions by changed elements (``spare_copies`` on); a bf16
    one only when asked; off, an engine is given none (whole tensors)."""
    fp32, bf16 = EngineArgs(model_dir, dtype="float32"), EngineArgs(model_dir, dtype="bfloat16")
    assert HFEngine(fp32, HFOptions()).takes_positions
    assert not HFEngine(fp32, HFOptions(spare_copies=False)).takes_positions
    assert not HFEngine(bf16, HFOptions()).takes_positions
    assert HFEngine(bf16, HFOptions(spare_copies=True)).takes_positions
