"""Probe sampling (``workers.generation.probing``, ``generator.probe_candidates``): each granted
group's prompt is the least likely probe's among its grant's candidates, the probe is its first
response, and the passed-over probes' tokens are counted apart."""

from __future__ import annotations

import pytest
import zmq

from streamrl.config import BufferConfig, ConfigError, load_config
from streamrl.controller.admission import AdmissionServer
from streamrl.controller.generation_yield import generation_yield
from streamrl.controller.staleness import AdmissionPolicy
from streamrl.controller.state import GeneratorHealth, RunState
from streamrl.models import TINY, load_tokenizer, resolve_model
from streamrl.protocol import AdmissionReply, AdmissionRequest, GeneratorReport, ShardStats
from streamrl.transport import Codec, make_socket
from streamrl.workers.engines.base import Engine, EngineArgs, GenerationOutput
from streamrl.workers.engines.hf import HFEngine
from streamrl.workers.generation.probing import least_likely, sample_probed
from streamrl.workers.generation.sampling import Sampler


def test_the_least_likely_probes_are_chosen_in_candidate_order() -> None:
    assert least_likely([-0.01, -2.3, -0.2, -0.05, -0.4, -0.01], 2) == [1, 4]
    assert least_likely([-1.0, -1.0, -1.0], 2) == [0, 1]  # ties: the stream's order
    assert least_likely([-3.0], 1) == [0]


class ScriptedEngine(Engine):
    """A test double: answers prompt ``[k]`` with three tokens ``k`` whose logprobs sum to
    ``sums[k]``, and records each call's prompts."""

    def __init__(self, sums: dict[int, float]) -> None:
        self.sums, self.calls = sums, []

    def generate(self, prompts, params, on_step=None):
        self.calls.append([p[0] for p in prompts])
        return [
            GenerationOutput([p[0]] * 3, [self.sums[p[0]] / 3] * 3, [0] * 3, "stop")
            for p in prompts
        ]

    def update_weights(self, named_tensors, version) -> None:
        pass


def test_the_chosen_candidates_are_sampled_in_full_with_their_probe_first() -> None:
    engine = ScriptedEngine({10: -0.01, 11: -2.3, 12: -0.2, 13: -0.05, 14: -0.4, 15: -0.01})
    probed = sample_probed(engine, [[k] for k in range(10, 16)], 2, 4, None, None)
    assert probed.chosen == [1, 4]
    # One probe call over every candidate, then 3 more responses of each chosen one.
    assert engine.calls == [[10, 11, 12, 13, 14, 15], [11, 11, 11, 14, 14, 14]]
    assert [out.response_ids[0] for out in probed.outputs] == [11] * 4 + [14] * 4
    assert probed.passed_over_tokens == 4 * 3


def test_a_sampler_probes_with_a_real_engine_and_counts_every_token() -> None:
    """The HF engine on the tiny model: two groups chosen among six candidates."""
    model_dir = resolve_model(TINY)
    tokenizer = load_tokenizer(model_dir)
    config = load_config(
        None,
        [
            "rewards=[{name: numeric_match}]",
            "generator.group_size=3",
            "generator.max_new_tokens=6",
            "generator.probe_candidates=3",
        ],
    )
    engine = HFEngine(EngineArgs(model_dir, dtype="float32", seed=0))
    probes: list[list[GenerationOutput]] = []
    generate = engine.generate

    def recorded(prompts, params, on_step=None):
        outputs = generate(prompts, params, on_step)
        probes.append(outputs)
        return outputs

    engine.generate = recorded  # type: ignore[method-assign]
    sampler = Sampler(config, engine, tokenizer, 0, None)
    try:
        groups = sampler.generate_groups([0, 1], epoch=0, candidates=[2, 3, 4, 5])
    finally:
        sampler.close()
    assert len(probes) == 2 and len(probes[0]) == 6 and len(probes[1]) == 2 * 2
    sums = [sum(out.logprobs) for out in probes[0]]
    chosen = least_likely(sums, 2)
    assert [g.prompt_index for g in groups] == chosen  # candidates 0-5 are prompts 0-5
    for g, c in zip(groups, chosen, strict=True):
        assert len(g.trajectories) == 3
        assert g.trajectories[0].response_text == tokenizer.decode(
            probes[0][c].response_ids, skip_special_tokens=True
        )
    in_groups = sum(len(t.response_ids) // 4 for g in groups for t in g.trajectories)
    passed = sum(len(probes[0][i].response_ids) for i in range(6) if i not in chosen)
    assert sampler.probe_tokens_passed_over == passed
    assert sampler.tokens_generated == in_groups + passed


def test_admission_offers_fresh_candidates_beside_each_grant(ctx: zmq.Context) -> None:
    state = RunState()
    state.health[0] = GeneratorHealth()
    policy = AdmissionPolicy(2, BufferConfig(max_staleness=1), state)
    server = AdmissionServer(ctx, policy, state, probe_candidates=3)
    sock = make_socket(ctx, zmq.DEALER)
    sock.connect(server.endpoint)
    codec: Codec[AdmissionReply] = Codec(AdmissionReply, "test")
    try:
        sock.send(codec.encode(AdmissionRequest(0, 2, 0)))
        assert sock.poll(5000)
        grant = codec.decode(sock.recv()).grant
    finally:
        sock.close()
        server.close()
    assert grant.granted == 2 and grant.prompt_indices == [0, 1]
    assert grant.candidates == [2, 3, 4, 5]
    # The candidates are owed to no one: only the granted prompts return if the generator dies.
    assert state.prompts.next_index == 6
    assert state.prompts.release(0) == 2 and list(state.prompts.retry) == [0, 1]


def test_passed_over_probes_are_their_own_loss() -> None:
    report = GeneratorReport(0, 0, 1000, 0, 0, 0, 0.0, probe_tokens_passed_over=150)
    shard = ShardStats(0, 0, 8, 0, 0, {}, 0, tokens_by_fate={"trained": 700, "zero_variance": 150})
    y = generation_yield([report], [shard])
    assert y.useful == 0.7 and y.lost["probe"] == 150 and y.lost["refused"] == 0


def test_an_episode_job_cannot_be_probed() -> None:
    with pytest.raises(ConfigError, match="generator.probe_candidates: an episode"):
        load_config(None, ["env.name=guess", "rewards=[]", "generator.probe_candidates=2"])
