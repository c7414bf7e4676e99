"""Screening (``generator.screen_samples``, ``workers.generation.screening``): a group's first
samples are generated and scored first, and a group they settle (alike, and no worse than its
reference) is delivered with them alone; every other group gets the rest of its samples in a
second engine call."""

from __future__ import annotations

import pytest

from streamrl.config import ConfigError, load_config
from streamrl.models import TINY, build_char_tokenizer, load_tokenizer, resolve_model
from streamrl.workers.engines.base import Engine, EngineArgs, GenerationOutput, SamplingParams
from streamrl.workers.engines.hf import HFEngine
from streamrl.workers.generation.sampling import Sampler
from streamrl.workers.generation.screening import Screening


@pytest.mark.parametrize(
    ("sampled", "reference", "settles"),
    [
        ([2.0, 2.0, 2.0, 2.0], None, True),  # alike: flat whatever comes next
        ([0.5, 0.5, 0.5, 0.5], None, True),  # alike and wrong, no reference to train on
        ([2.0, 2.0, 2.0, 2.0], 2.0, True),  # as good as the reference
        ([0.5, 0.5, 0.5, 0.5], 2.0, False),  # the reference would teach it: sampled whole
        ([2.0, 0.5, 2.0, 2.0], None, False),  # it varies already
    ],
)
def test_a_group_is_settled_only_when_its_first_samples_leave_nothing_to_learn(
    sampled: list[float], reference: float | None, settles: bool
) -> None:
    screening = Screening(4, 8)
    assert screening.settles(sampled, reference) is settles
    assert (screening.groups_settled, screening.samples_saved) == ((1, 4) if settles else (0, 0))


class _Scripted(Engine):
    """A test double: each prompt's rows answer from a script by the prompt's position among
    the prompts the test names (the right answer, or right and wrong in turn)."""

    def __init__(self, tokenizer, answers: dict[tuple[int, ...], list[str]]) -> None:
        self.tokenizer, self.answers = tokenizer, answers
        self.calls: list[int] = []
        self.given = dict.fromkeys(answers, 0)

    def generate(self, prompts, params: SamplingParams, on_step=None) -> list[GenerationOutput]:
        self.calls.append(len(prompts))
        outputs = []
        for ids in prompts:
            key = tuple(ids)
            text = self.answers[key][self.given[key] % len(self.answers[key])]
            self.given[key] += 1
            response = [*self.tokenizer.encode(text, add_special_tokens=False)]
            response.append(self.tokenizer.eos_token_id)
            n = len(response)
            outputs.append(GenerationOutput(response, [-0.1] * n, [self.version] * n, "stop"))
        return outputs

    def update_weights(self, *args, **kwargs) -> None:
        raise AssertionError("no weights in this test")


@pytest.mark.parametrize("guidance", [False, True])
def test_a_sampler_settles_a_solved_group_by_its_first_samples(guidance: bool) -> None:
    tokenizer = build_char_tokenizer()
    config = load_config(
        None,
        [
            "rewards=[{name: numeric_match}]",
            "generator.group_size=8",
            "generator.screen_samples=4",
            "buffer.drop_zero_variance=true",
            f"algorithm.guidance={str(guidance).lower()}",
        ],
    )
    engine = _Scripted(tokenizer, {})
    sampler = Sampler(config, engine, tokenizer, 0, None)
    try:
        solved, mixed, wrong = (sampler.prompts[i] for i in range(3))
        engine.answers = {
            tuple(sampler._encode(solved)): [solved.ground_truth],
            tuple(sampler._encode(mixed)): ["999", "999", "999", "999", mixed.ground_truth],
            tuple(sampler._encode(wrong)): ["999"],
        }
        engine.given = dict.fromkeys(engine.answers, 0)
        groups = sampler.generate_groups([0, 1, 2], epoch=0)
    finally:
        sampler.close()
    sizes = [len(g.trajectories) for g in groups]
    # The solved group stops at its first four; the mixed one (alike at four, wrong) and the
    # wrong one are sampled whole where a reference would teach them (the wrong one then
    # trains on seven and its reference), settled without one.
    assert sizes == ([4, 8, 8] if guidance else [4, 4, 4])
    assert engine.calls == ([12, 8] if guidance else [12])
    if guidance:  # the mixed group found its right answer; the wrong one trains on its reference
        assert [t.reward for t in groups[1].trajectories] == [0.0] * 4 + [1.0] + [0.0] * 3
        assert groups[2].trajectories[-1].guided and sampler.guidance.groups_guided == 1
    screening = sampler.screening
    assert screening.groups_settled == (1 if guidance else 3)
    assert screening.samples_saved == 4 * screening.groups_settled
    sampled = sum(t.num_response_tokens for g in groups for t in g.trajectories if not t.guided)
    assert sampler.tokens_generated == sampled + sampler.guidance.tokens_displaced


def test_a_random_model_s_groups_are_sampled_whole_with_guidance() -> None:
    """The HF engine on the tiny random model, the default job's four rules: every sample
    scores below the worked equation, so with guidance no group is settled early (each trains
    on its reference) and each has its full group of samples."""
    model_dir = resolve_model(TINY)
    config = load_config(
        None,
        [
            "generator.group_size=4",
            "generator.screen_samples=2",
            "generator.max_new_tokens=16",
            "buffer.drop_zero_variance=true",
            "algorithm.guidance=true",
        ],
    )
    engine = HFEngine(EngineArgs(model_dir, dtype="float32", seed=0))
    sampler = Sampler(config, engine, load_tokenizer(model_dir), 0, None)
    try:
        groups = sampler.generate_groups([0, 1], epoch=0)
    finally:
        sampler.close()
    for group in groups:
        assert len(group.trajectories) == 4 and group.trajectories[-1].guided
        newest = max(t.max_version for t in group.trajectories[:-1])
        assert group.trajectories[-1].version_range() == (newest, newest)
    assert sampler.screening.groups_settled == 0


@pytest.mark.parametrize(
    "overrides",
    [
        ["generator.screen_samples=8"],  # not fewer than the group
        ["generator.screen_samples=1"],
        ["buffer.drop_zero_variance=false"],
        ["generator.probe_candidates=2"],
        ["env.name=guess", "rewards=[]"],
        ["rewards=[{model: some/reward-model}]"],
    ],
)
def test_screening_is_refused_where_it_cannot_settle_a_group(overrides: list[str]) -> None:
    with pytest.raises(ConfigError, match="generator.screen_samples"):
        load_config(
            None,
            [
                "generator.group_size=8",
                "generator.screen_samples=4",
                "buffer.drop_zero_variance=true",
                *overrides,
            ],
        )


@pytest.mark.parametrize(
    ("overrides", "resolved"),
    [
        ([], 4),  # rules only, flat groups dropped: half the group
        (["generator.group_size=6"], 3),
        (["generator.group_size=3"], 0),  # too small to split
        (["buffer.drop_zero_variance=false"], 0),
        (["generator.probe_candidates=2"], 0),
        (["env.name=guess", "rewards=[]"], 0),
        (["rewards+=[{model: some/reward-model}]"], 0),
    ],
)
def test_auto_screens_half_the_group_where_the_job_can_and_is_off_elsewhere(
    overrides: list[str], resolved: int
) -> None:
    """The default job's ``auto``: a user who adds a reward model, an environment or probes
    to it gets screening off, not a refusal; a number stays the user's own, checked."""
    config = load_config(
        None,
        [
            "generator.group_size=8",
            "buffer.drop_zero_variance=true",
            "generator.screen_samples=auto",
            *overrides,
        ],
    )
    assert config.generator.screen_samples == resolved


def test_the_default_job_screens_and_a_teacher_added_to_it_turns_screening_off() -> None:
    assert load_config("configs/default.yaml").generator.screen_samples == 4
    with_teacher = load_config(
        "configs/default.yaml", ["rewards+=[{teacher: {model: runs/t, top_k: 8}}]"]
    )
    assert with_teacher.generator.screen_samples == 0
