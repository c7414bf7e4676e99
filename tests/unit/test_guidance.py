"""Off-policy guidance (``workers.generation.guidance``, ``algorithm.guidance``): a group none of
whose samples scores as well as its prompt's reference response trains on the reference in
place of its last sample; any other group is left as sampled; the reference's tokens are no
generation, the displaced sample's are counted lost."""

from __future__ import annotations

import pytest

from streamrl.config import ConfigError, load_config
from streamrl.data import Prompt
from streamrl.models import TINY, build_char_tokenizer, load_tokenizer, resolve_model
from streamrl.protocol import Trajectory, TrajectoryGroup
from streamrl.tasks.arithmetic import arithmetic_question
from streamrl.workers.engines.base import EngineArgs
from streamrl.workers.engines.hf import HFEngine
from streamrl.workers.generation.guidance import Guidance
from streamrl.workers.generation.sampling import Sampler

QUESTION = Prompt("p", [{"role": "user", "content": "5 - 17 = ?"}], "-12", "arithmetic")


def _with_reference(reference: str) -> Prompt:
    return Prompt(QUESTION.prompt_id, QUESTION.messages, "-12", "arithmetic", reference=reference)


def _sample(reward: float, tokens: int = 3, version: int = 4) -> Trajectory:
    n = tokens
    return Trajectory.from_lists([1], [5] * n, [-0.5] * n, [version] * n, reward, "stop", 0)


def _group(rewards: list[float], reference_reward: float) -> tuple[TrajectoryGroup, Trajectory]:
    guidance = Guidance(build_char_tokenizer(), 32, 0)
    reference = guidance.trajectory(b"\x01\x00\x00\x00", [7, 8], 0.7, version=4)
    reference.reward = reference_reward
    group = TrajectoryGroup("", "p", [*map(_sample, rewards), reference], 0.0, 0.0)
    return group, reference


def test_a_group_that_found_nothing_as_good_trains_on_the_reference() -> None:
    guidance = Guidance(build_char_tokenizer(), 32, 0)
    group, reference = _group([0.5, 0.5, 0.5], 2.0)
    guidance.settle(group)
    assert group.trajectories[-1] is reference and len(group.trajectories) == 3
    assert [t.reward for t in group.trajectories] == [0.5, 0.5, 2.0]
    assert reference.num_policy_tokens == 0 and group.policy_tokens == 6
    assert group.version_range() == (4, 4)  # the reference is as stale as the samples
    assert guidance.groups_guided == 1 and guidance.tokens_displaced == 3


def test_a_kept_reference_drops_its_teachers_scores() -> None:
    """Distillation beside the rewards: a teacher scored the reference too, but its term needs
    behaviour logprobs: the reference trains by its reward alone."""
    group, reference = _group([0.5, 0.5], 2.0)
    reference.teacher_logprobs, reference.teacher_coef = bytes(8), 0.5
    reference.teacher_top_ids, reference.teacher_top_logprobs = bytes(8), bytes(8)
    reference.teacher_top_coef = 0.5
    Guidance(build_char_tokenizer(), 32, 0).settle(group)
    assert group.trajectories[-1] is reference and not group.distilled
    assert reference.teacher_coef == 0 and reference.teacher_top_coef == 0


@pytest.mark.parametrize(
    ("rewards", "reference_reward", "unscored"),
    [
        ([0.5, 2.0, 0.5], 2.0, ""),  # a sample as good as the reference
        ([0.5, 0.5, 0.5], float("nan"), ""),  # the reference could not be scored
        ([0.5, float("nan"), 0.5], 2.0, ""),
        ([0.5, 0.5, 0.5], 2.0, "rm: no reply"),  # a refused group
    ],
)
def test_any_other_group_is_left_as_sampled(
    rewards: list[float], reference_reward: float, unscored: str
) -> None:
    guidance = Guidance(build_char_tokenizer(), 32, 0)
    group, _ = _group(rewards, reference_reward)
    group.unscored = unscored
    sampled = list(group.trajectories[:-1])
    guidance.settle(group)
    assert group.trajectories == sampled and guidance.groups_guided == 0
    assert guidance.tokens_displaced == 0


def test_the_reference_is_written_as_the_model_ends_a_turn() -> None:
    chat = load_tokenizer(resolve_model(TINY))
    guidance = Guidance(chat, 32, 0)
    ids = guidance.response_ids(_with_reference("5 - 17 = -12"))
    assert ids is not None and ids[-1] in guidance.stops
    assert sum(i in guidance.stops for i in ids) == 1
    assert chat.decode(ids, skip_special_tokens=True) == "5 - 17 = -12"
    plain = build_char_tokenizer()
    plain.chat_template = None
    ids = Guidance(plain, 32, 0).response_ids(_with_reference("5 - 17 = -12"))
    assert ids is not None and plain.decode(ids) == "5 - 17 = -12\n"
    short = Guidance(chat, 4, 0)
    assert short.response_ids(_with_reference("5 - 17 = -12")) is None and short.too_long == 1
    assert guidance.response_ids(QUESTION) is None  # no reference: no guidance


def test_the_arithmetic_task_writes_its_reference_as_an_equation() -> None:
    config = load_config(None, [])
    prompt = arithmetic_question(config.data, 0, 3)
    left, right = prompt.reference.split(" = ")
    assert right == prompt.ground_truth and eval(left) == int(prompt.ground_truth)  # noqa: S307


def test_a_sampler_guides_the_groups_a_random_model_gets_wrong() -> None:
    """The HF engine on the tiny random model: every sample is wrong, so each group's last
    sample is its reference, scored by the rules as the samples are; generation counts only
    what was sampled."""
    model_dir = resolve_model(TINY)
    tokenizer = load_tokenizer(model_dir)
    config = load_config(
        None,
        [
            "rewards=[{name: numeric_match}]",
            "generator.group_size=3",
            "generator.max_new_tokens=16",
            "algorithm.guidance=true",
        ],
    )
    engine = HFEngine(EngineArgs(model_dir, dtype="float32", seed=0))
    sampler = Sampler(config, engine, tokenizer, 0, None)
    try:
        groups = sampler.generate_groups([0, 1], epoch=0)
    finally:
        sampler.close()
    for group in groups:
        prompt = sampler.prompts[group.prompt_index]
        *samples, reference = group.trajectories
        assert len(samples) == 2 and not any(t.guided for t in samples)
        assert reference.guided and reference.response_text == prompt.reference
        assert reference.reward == 1.0 and all(t.reward == 0.0 for t in samples)
    generated = sum(t.num_response_tokens for g in groups for t in g.trajectories if not t.guided)
    guidance = sampler.guidance
    assert guidance.groups_guided == 2
    assert sampler.tokens_generated == generated + guidance.tokens_displaced


@pytest.mark.parametrize(
    "overrides",
    [
        ["env.name=guess", "rewards=[]"],
        ["algorithm.kl.in_reward=true", "algorithm.kl.coef=0.1"],
    ],
)
def test_guidance_is_refused_where_it_cannot_take_a_samples_place(overrides: list[str]) -> None:
    with pytest.raises(ConfigError, match="algorithm.guidance"):
        load_config(None, ["algorithm.guidance=true", *overrides])


@pytest.mark.parametrize(
    ("job", "overrides"),
    [
        ("default", []),
        ("countdown_gym", []),
        ("default", ["data.source=countdown", "rewards=[{name: countdown}]"]),
    ],
)
def test_a_tasks_references_are_right_by_its_own_check(job: str, overrides: list[str]) -> None:
    """Each reference a built-in task writes gets full marks from the job's first reward (its
    correctness check), so guidance never teaches a wrong answer."""
    from streamrl.config import shipped_config
    from streamrl.data import prompt_stream
    from streamrl.rewards import RewardInput
    from streamrl.rewards.base import resolve_reward

    config = load_config(shipped_config(job), overrides)
    check = config.rewards[0]
    stream = prompt_stream(config)
    for index in range(20):
        prompt = stream[index]
        sample = RewardInput.of(prompt, prompt.reference, [], "stop")
        assert resolve_reward(check.name)(sample, **check.args) == 1.0, prompt.reference
