"""The HF engine's sampler draws exactly from the truncated distribution, and sharing the
prefill of repeated prompts changes nothing but the cost."""

from __future__ import annotations

import pytest
import torch

from streamrl.models import TINY, resolve_model
from streamrl.workers.engines.base import EngineArgs, SamplingParams
from streamrl.workers.engines.hf import HFEngine, sample_tokens


def test_inverse_cdf_draw_matches_the_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]]).repeat(40_000, 1)
    generator = torch.Generator().manual_seed(0)
    tokens, logprobs = sample_tokens(logits, SamplingParams(temperature=1.0), generator)
    expected = torch.softmax(logits[0], -1)
    observed = torch.bincount(tokens, minlength=5).float() / len(tokens)
    # 40k draws: the standard error of each frequency is below 0.0025.
    assert torch.allclose(observed, expected, atol=0.01), (observed, expected)
    assert torch.allclose(logprobs, expected.log()[tokens])


def test_temperature_and_top_p_draw_from_the_renormalised_distribution() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]]).repeat(40_000, 1)
    params = SamplingParams(temperature=2.0, top_p=0.8)
    tokens, logprobs = sample_tokens(logits, params, torch.Generator().manual_seed(2))
    probs = torch.softmax(logits[0] / 2.0, -1)
    kept = (probs.cumsum(-1) - probs) < 0.8  # the nucleus: tokens 0..2 here
    expected = torch.where(kept, probs, 0.0) / probs[kept].sum()
    observed = torch.bincount(tokens, minlength=5).float() / len(tokens)
    assert observed[~kept].sum() == 0  # a token of zero mass is never drawn
    assert torch.allclose(observed, expected, atol=0.01), (observed, expected)
    assert torch.allclose(logprobs, expected.log()[tokens])


def test_top_k_never_draws_outside_the_kept_set() -> None:
    logits = torch.randn(2000, 50)
    tokens, _ = sample_tokens(logits, SamplingParams(top_k=3), torch.Generator().manual_seed(1))
    top3 = logits.topk(3, dim=-1).indices
    assert bool((top3 == tokens[:, None]).any(-1).all())


@pytest.fixture(scope="module")
def engine() -> HFEngine:
    return HFEngine(EngineArgs(resolve_model(TINY), seed=0))


def test_shared_prefill_equals_separate_prefill(engine: HFEngine) -> None:
    prompts = [[1, 20, 30, 40], [1, 50, 60], [1, 20, 30, 40], [1, 20, 30, 40], [1, 50, 60]]
    _, attention, lengths, logits = engine._prefill(prompts)
    _, attention_ref, lengths_ref, logits_ref = engine._prefill_distinct(prompts)
    assert torch.equal(attention, attention_ref) and torch.equal(lengths, lengths_ref)
    assert torch.allclose(logits.float(), logits_ref.float(), atol=1e-2)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    together = engine.generate(prompts, greedy)
    alone = [engine.generate([p], greedy)[0] for p in prompts]
    assert [o.response_ids for o in together] == [o.response_ids for o in alone]
