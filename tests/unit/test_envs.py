"""The built-in environments (``streamrl.envs``) and how a config names one."""

from __future__ import annotations

import pytest

from streamrl.config import ConfigError, EnvConfig, load_config
from streamrl.envs import ENVS, StepResult, check_env, environment_factory, resolve_env
from streamrl.envs.base import Environment
from streamrl.envs.calculator import Calculator
from streamrl.envs.guess import GuessNumber
from streamrl.tasks import TASKS
from streamrl.tasks.base import Prompt


class Echo(Environment):
    """A user's environment, as a plugin module would define it."""

    def reset(self, prompt: Prompt) -> None:
        self.truth = prompt.ground_truth

    def step(self, text: str) -> StepResult:
        return StepResult(reward=float(self.truth in text), done=True, success=self.truth in text)


def _prompt(truth: str) -> Prompt:
    return Prompt("p", [{"role": "user", "content": "q"}], truth, "test")


def test_the_calculator_answers_a_tool_call_and_checks_the_final_answer() -> None:
    env = Calculator()
    env.reset(_prompt("17"))
    call = env.step("<calc>23 + 8 - 14</calc>")
    assert (call.observation, call.done, call.counts) == (
        "<result>17</result>",
        False,
        {"tool_calls": 1.0},
    )
    assert env.step("<calc>(25 - 3) * 2 / 4</calc>").observation == "<result>11</result>"
    assert env.step("<calc>1 / 3</calc>").observation == "<result>0.333333</result>"
    assert env.step("<calc>1 / (2 - 2)</calc>").observation == "<result>undefined</result>"
    right = env.step(" 17.\n")
    assert (right.reward, right.done, right.success) == (1.0, True, True)
    # Not a number alone: no answer, even where the right number appears.
    for text in ("18", "The answer is 17", "<result>17</result>", ""):
        result = env.step(text)
        assert (result.reward, result.done, result.success) == (0.0, True, False), text


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("<calc>2 + 2", "malformed tool call: no </calc>"),
        ("<calc>__import__('os')</calc>", "malformed tool call: not an expression"),
        ("<calc>2 ** 99999</calc>", "malformed tool call: not an expression"),
        ("<calc></calc>", "malformed tool call: not an expression"),
    ],
)
def test_a_malformed_tool_call_ends_the_episode_with_its_reason(text: str, reason: str) -> None:
    env = Calculator()
    env.reset(_prompt("4"))
    result = env.step(text)
    assert (result.done, result.reward, result.error) == (True, 0.0, reason)


def test_the_guessing_game_gives_feedback_and_pays_guesses_the_feedback_allows() -> None:
    env = GuessNumber(consistent=0.1)
    env.reset(_prompt("20:13"))
    first = env.step("10")
    assert (first.observation, first.reward, first.done) == ("Higher.", 0.1, False)
    assert env.step("5 maybe").reward == 0.0  # below what "Higher." left open
    assert env.step("16").observation == "Lower."
    assert env.step("I do not know").observation == "Reply with one whole number."
    win = env.step("13")
    assert (win.done, win.success, win.reward) == (True, True, 1.1)


def test_the_guess_task_draws_ranges_and_numbers_and_holds_some_out() -> None:
    config = load_config(None, ["data.source=guess", "data.max_operand=20"])
    task = TASKS["guess"]
    train = [task.question(config.data, 0, i, "train") for i in range(200)]
    held = {task.question(config.data, 0, i, "eval").ground_truth for i in range(50)}
    for prompt in train:
        top, secret = map(int, prompt.ground_truth.split(":"))
        assert 4 <= top <= 20 and 1 <= secret <= top
        assert f"from 1 to {top}" in prompt.messages[-1]["content"]
    assert held and not held & {p.ground_truth for p in train}
    assert task.question(config.data, 0, 7, "train") == train[7]  # the same on every call


def test_a_config_names_a_builtin_or_a_users_environment() -> None:
    assert set(ENVS) == {"calculator", "guess"}
    assert resolve_env(f"{__name__}:Echo") is Echo
    env = environment_factory(EnvConfig(name="guess", args={"consistent": 0.5}))()
    assert isinstance(env, GuessNumber) and env.consistent == 0.5
    for name, message in [
        ("nope", "unknown env.name 'nope'"),
        ("no.such.module:Env", "env.name 'no.such.module:Env' cannot be loaded"),
        ("streamrl.envs.base:StepResult", "is not a streamrl.envs.Environment subclass"),
    ]:
        with pytest.raises(ConfigError, match=message):
            resolve_env(name)
    with pytest.raises(ConfigError, match="env 'guess' with args"):
        check_env(EnvConfig(name="guess", args={"colour": "red"}))


def test_an_environment_job_takes_its_reward_from_the_environment() -> None:
    config = load_config(None, ["env.name=guess", "rewards=[]"])
    assert config.env.name == "guess" and config.rewards == []
    with pytest.raises(ConfigError, match="reward comes from its environment"):
        load_config(None, ["env.name=guess"])  # the default rewards left in
    with pytest.raises(ConfigError, match="rewards must name at least one reward"):
        load_config(None, ["rewards=[]"])
    with pytest.raises(ConfigError, match="env.max_turns must be >= 1"):
        load_config(None, ["env.name=guess", "rewards=[]", "env.max_turns=0"])
