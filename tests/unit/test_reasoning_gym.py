"""``data.source: reasoning_gym:<task>``: reasoning-gym's prompts with a held-out split, and its
own verifier as the ``reasoning_gym`` reward and the held-out check."""

from __future__ import annotations

import functools
import json

import pytest

from streamrl.config import ConfigError, load_config
from streamrl.data import check_data, prompt_stream
from streamrl.evaluation import eval_prompts, exact_answer
from streamrl.rewards import RewardInput, resolve_reward
from streamrl.tasks.base import Prompt

pytest.importorskip("reasoning_gym")

SOURCE = "reasoning_gym:basic_arithmetic"


def config(*extra: str):
    return load_config(
        None,
        [f"data.source={SOURCE}", "data.args={min_terms: 2, max_terms: 2}", "eval.every=5", *extra],
    )


def test_prompts_are_seeded_and_the_held_out_split_is_disjoint() -> None:
    cfg = config("eval.max_prompts=40")
    check_data(cfg)
    stream = prompt_stream(cfg)
    train = [stream[i] for i in range(300)]
    assert [p.messages[-1]["content"] for p in train[:5]] == [
        prompt_stream(cfg)[i].messages[-1]["content"] for i in range(5)
    ]
    held = eval_prompts(cfg)
    assert len(held) == 40
    assert not {p.key for p in train} & {p.key for p in held}
    assert train[0].data_source == SOURCE
    assert "<answer>" in train[0].messages[0]["content"]  # reasoning-gym's instruction


def test_its_verifier_is_the_reward_and_the_exact_check() -> None:
    prompt = prompt_stream(config())[0]
    reward = resolve_reward("reasoning_gym")
    right = f"Let me add.\n<answer>{prompt.ground_truth}</answer>"
    wrong = "<answer>not a number</answer>"
    assert reward(RewardInput.of(prompt, right, [1])) == 1.0
    assert reward(RewardInput.of(prompt, wrong, [1])) == 0.0
    assert reward(RewardInput.of(prompt, prompt.ground_truth, [1])) == 1.0  # its last line
    assert exact_answer(prompt, right) and not exact_answer(prompt, wrong)


@pytest.mark.parametrize(
    ("source", "args", "message"),
    [
        ("reasoning_gym:no_such_task", "{}", "data.source reasoning_gym:no_such_task"),
        (SOURCE, "{bogus: 1}", "data.source reasoning_gym:basic_arithmetic: "),
    ],
)
def test_a_bad_task_or_args_fails_in_one_line(source: str, args: str, message: str) -> None:
    cfg = load_config(None, [f"data.source={source}", f"data.args={args}"])
    with pytest.raises(ConfigError, match=message) as info:
        check_data(cfg)
    assert "\n" not in str(info.value)


def test_first_line_answers_and_stopped_after_the_same_reading() -> None:
    from streamrl.config import load_config as load
    from streamrl.rewards import CombinedReward

    cfg = load("countdown_gym")
    check_data(cfg)
    prompt = prompt_stream(cfg)[0]
    reward = CombinedReward(cfg.rewards)
    right = f"{prompt.ground_truth} = {prompt.metadata['entry']['metadata']['target']}\nso"
    assert reward(RewardInput.of(prompt, right, [1], "stop")) == 1.75  # solved, near, ended
    assert reward(RewardInput.of(prompt, right, [1], "length")) == 1.5  # solved, cut off
    assert reward(RewardInput.of(prompt, "so\n" + prompt.ground_truth, [1], "stop")) == 0.01
    gym_reward = resolve_reward("reasoning_gym")
    assert gym_reward(RewardInput.of(prompt, "so\n" + prompt.ground_truth, [1])) == 1.0
    with pytest.raises(ValueError, match="answer must be one of"):
        gym_reward(RewardInput.of(prompt, "x", [1]), answer="middle")


def test_countdown_close_pays_a_legal_near_miss_by_its_distance() -> None:
    from streamrl.config import load_config as load
    from streamrl.tasks import TASKS

    prompt = prompt_stream(load("countdown_gym"))[0]
    meta = prompt.metadata["entry"]["metadata"]
    target, numbers = meta["target"], sorted(meta["numbers"])
    close = resolve_reward("countdown_close")
    assert close(RewardInput.of(prompt, prompt.ground_truth, [1])) == 1.0
    plus = " + ".join(map(str, numbers))  # every number once: legal, off by |sum - target|
    expected = max(0.0, 1 - abs(sum(numbers) - target) / 20)
    assert close(RewardInput.of(prompt, plus + " = ?\nso", [1])) == pytest.approx(expected)
    assert close(RewardInput.of(prompt, " + ".join(map(str, numbers[:2])), [1])) == 0.0  # not all
    assert close(RewardInput.of(prompt, "2 ** 9", [1])) == 0.0
    # The built-in countdown: each number at most once.
    task = TASKS["countdown"].question(load(None, ["data.source=countdown"]).data, 0, 0)
    puzzle = json.loads(task.ground_truth)
    two = f"{puzzle['numbers'][0]} + {puzzle['numbers'][1]}"
    near = max(0.0, 1 - abs(puzzle["numbers"][0] + puzzle["numbers"][1] - puzzle["target"]) / 20)
    assert close(RewardInput.of(task, two, [1])) == pytest.approx(near)


def test_countdown_close_grades_the_way_from_a_bare_number_to_a_legal_expression() -> None:
    """reasoning-gym pays 0.05 for any parseable non-solution: a policy that drifted to bare
    numbers scored every group alike and starved. ``partial`` ranks bare number < some of
    the numbers < all of them (legal, however far) < near < solved."""
    from streamrl.config import load_config as load

    prompt = prompt_stream(load("countdown_gym"))[0]
    meta = prompt.metadata["entry"]["metadata"]
    target, numbers = meta["target"], sorted(meta["numbers"])
    close = functools.partial(resolve_reward("countdown_close"), partial=0.3)

    def pays(text: str) -> float:
        return close(RewardInput.of(prompt, text, [1]))

    far = " * ".join(map(str, numbers)) + " * 1000"  # every number, and one not given
    assert pays(str(numbers[0])) == pytest.approx(0.1)  # one given number of three
    assert pays(" + ".join(map(str, numbers[:2]))) == pytest.approx(0.2)
    assert pays(far) == pytest.approx(0.2)  # the extra 1000 cancels one used number
    assert pays("1000") == 0.0 and pays("so") == 0.0
    plus = " + ".join(map(str, numbers))
    near = max(0.0, 1 - abs(sum(numbers) - target) / 20)
    assert pays(plus) == pytest.approx(0.3 + 0.7 * near) and pays(plus) >= 0.3
    assert pays(prompt.ground_truth) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="partial must be in"):
        close(RewardInput.of(prompt, plus, [1]), partial=1.0)


def test_countdown_close_inverse_falloff_ranks_every_legal_miss() -> None:
    """With the linear falloff every miss farther than ``scale`` earns ``partial``: a policy
    settled on "a * b + c" (legal, far) earned as much as "a + b + c" (legal, nearer).
    ``inverse`` (scale / (scale + d)) ranks any two legal misses by their distance."""
    from streamrl.config import load_config as load

    def puzzle(prompt: Prompt) -> tuple[int, list[int]]:
        meta = prompt.metadata["entry"]["metadata"]
        return meta["target"], sorted(meta["numbers"])

    # A puzzle that "a + b + c" does not solve.
    prompt = next(
        p for p in prompt_stream(load("countdown_gym")) if sum(puzzle(p)[1]) != puzzle(p)[0]
    )
    target, (a, b, c) = puzzle(prompt)
    close = functools.partial(resolve_reward("countdown_close"), partial=0.3, falloff="inverse")

    def pays(text: str) -> float:
        return close(RewardInput.of(prompt, text, [1]))

    times, plus = f"{a} * {b} * {c}", f"{a} + {b} + {c}"
    assert abs(a * b * c - target) > abs(a + b + c - target)
    assert 0.3 < pays(times) < pays(plus) < 1.0  # both legal misses, the nearer above
    assert pays(plus) == pytest.approx(0.3 + 0.7 * 20 / (20 + abs(a + b + c - target)))
    assert pays(prompt.ground_truth) == pytest.approx(1.0)
    assert pays(f"{a} + {b}") == pytest.approx(0.2)  # an illegal answer as before
    with pytest.raises(ValueError, match="falloff must be one of"):
        close(RewardInput.of(prompt, plus, [1]), falloff="cubic")
