from __future__ import annotations

import itertools
import re

import pytest

from streamrl.config import ConfigError, DataConfig, RewardSpec, load_config
from streamrl.data import arithmetic_question, check_data, prompt_source
from streamrl.rewards import CombinedReward, RewardInput, check_rewards, resolve_reward


def test_arithmetic_is_seeded_and_streams_are_disjoint() -> None:
    config = DataConfig()
    a = [p.prompt_id for p in itertools.islice(prompt_source(config, 1, 0, 2), 5)]
    b = [p.prompt_id for p in itertools.islice(prompt_source(config, 1, 1, 2), 5)]
    assert not set(a) & set(b)
    again = list(itertools.islice(prompt_source(config, 1, 0, 2), 5))
    first = list(itertools.islice(prompt_source(config, 1, 0, 2), 5))
    assert again == first
    p = first[0]
    a_, op, b_ = p.messages[-1]["content"].removeprefix("What is ").rstrip("?").split()
    assert str(eval(f"{a_}{op}{b_}")) == p.ground_truth  # noqa: S307 - our own digits


@pytest.mark.parametrize(
    ("name", "text", "truth", "expected"),
    [
        ("numeric_match", "19", "19", 1.0),
        ("numeric_match", "The answer is 1,024.", "1024", 1.0),
        ("numeric_match", "18", "19", 0.0),
        ("numeric_match", "12 + 8 = 20", "20", 1.0),  # an equation states its right-hand side
        ("numeric_match", "20 + 0 = 21", "20", 0.0),  # not its first number
        ("numeric_match", "20 + 0 =", "20", 0.0),  # cut off before the answer
        ("numeric_match", "3 - 10 = -7\nso", "-7", 1.0),
        ("number_only", " 18\nbecause", "19", 1.0),
        ("number_only", "-3", "-3", 1.0),
        ("number_only", "1,024.5 ", "0", 1.0),
        ("number_only", "12 + 8 = 20", "20", 0.0),
        ("number_only", "The answer is 19", "19", 0.0),
        ("numeric_close", "19", "19", 1.0),
        ("numeric_close", " 17\n", "19", 0.6),  # 2 off of the default scale 5
        ("numeric_close", "-30", "19", 0.0),  # no credit past the scale
        ("numeric_close", "12 + 7 = 19", "19", 0.0),  # a bare number only
        ("gsm8k", "so #### 42", "work...\n#### 42", 1.0),
        ("gsm8k", "42", "#### 42", 0.0),
        ("boxed_math", r"thus \boxed{\frac{1}{2}}", r"\frac{1}{2}", 1.0),
        ("boxed_math", r"\boxed{3}", "3.0", 1.0),
        ("exact_match", " yes ", "yes", 1.0),
    ],
)
def test_verifiers(name: str, text: str, truth: str, expected: float) -> None:
    assert resolve_reward(name)(RewardInput(text, [], truth)) == expected


def test_combined_weights_and_plugins() -> None:
    reward = CombinedReward(
        [
            RewardSpec(name="exact_match", weight=0.5),
            RewardSpec(name="target_token_share", weight=2.0, args={"token_id": 7}),
        ]
    )
    assert reward(RewardInput("x", [7, 1, 7, 1], "x")) == pytest.approx(0.5 + 2.0 * 0.5)
    assert resolve_reward("os.path:basename") is not None
    with pytest.raises(ConfigError, match="unknown reward"):
        resolve_reward("nope")
    with pytest.raises(ConfigError, match="cannot be loaded"):
        resolve_reward("no_such_module_xyz:fn")


def test_question_template_words_the_question() -> None:
    config = DataConfig(args={"question_template": "{a} {op} {b} = ?"})
    p = next(prompt_source(config, 1, 0, 1))
    a_, op, b_, _, _ = p.messages[-1]["content"].split()
    assert str(eval(f"{a_}{op}{b_}")) == p.ground_truth  # noqa: S307 - our own digits


def test_training_questions_vary_their_wording_and_eval_questions_do_not() -> None:
    """Training draws each question's wording from the templates and drops the system
    prompt for about the configured share; the numbers are those of the one-template stream;
    the held-out split keeps the first template with the system prompt."""
    plain = DataConfig()
    varied = DataConfig(
        args={
            "question_templates": ["{a} {op} {b} = ?", "Calculate {a} {op} {b}."],
            "no_system_prompt_share": 0.5,
        }
    )
    wordings, without_system = set(), 0
    for i in range(400):
        p, q = arithmetic_question(plain, 3, i), arithmetic_question(varied, 3, i)
        assert (p.ground_truth, p.prompt_id) == (q.ground_truth, q.prompt_id)
        user = q.messages[-1]["content"]
        wordings.add(user.split()[0] if user[0].isalpha() else "=")
        without_system += len(q.messages) == 1
    assert wordings == {"What", "=", "Calculate"}
    assert 150 < without_system < 250
    for i in range(50):
        e = arithmetic_question(varied, 3, i, split="eval")
        assert e.messages[0]["role"] == "system" and e.messages[-1]["content"].startswith("What")


def test_the_unseen_phrasing_must_not_be_trained_on() -> None:
    with pytest.raises(ConfigError, match="unseen_phrasing"):
        check_data(load_config(None, ["data.question_templates=['Compute {a} {op} {b}.']"]))


@pytest.mark.parametrize("template", ["What is {a} + {b}?", "{a} {op} {b} {c}", "{a {op} {b}"])
def test_question_template_must_name_a_op_and_b(template: str) -> None:
    with pytest.raises(ConfigError, match="question.template"):
        check_data(load_config(None, [f"data.args.question_template={template}"]))


def test_number_only_alone_wants_nothing_after_the_number() -> None:
    alone = resolve_reward("number_only")
    assert alone(RewardInput("19\n\nAnswer with", [1], "19")) == 1.0
    assert alone(RewardInput("19\n\nAnswer with", [1], "19"), alone=True) == 0.0
    assert alone(RewardInput(" 19 \n", [1], "19"), alone=True) == 1.0


@pytest.mark.parametrize(
    ("text", "form", "close"),
    [
        ("12 + 8 = 20", 1.0, 1.0),
        (" 12 + 8 = -7\n", 1.0, 0.0),  # 27 off of 20
        ("12+8=18", 1.0, 0.6),  # whitespace aside
        ("12 + 8 = 20\nso", 0.0, 0.0),  # alone: nothing after it
        ("12 + 8 =", 0.0, 0.0),  # no answer yet
        ("x = 20", 0.0, 0.0),  # not arithmetic
        ("+ = 20", 0.0, 0.0),  # no number on the left
        ("20", 0.0, 1.0),  # a bare number is no equation, but near
    ],
)
def test_equation_form_and_near_misses_stated_as_equations(
    text: str, form: float, close: float
) -> None:
    """``equation_form`` pays the question restated as an equation that is the whole
    response, right or wrong; ``numeric_close`` with ``equation`` judges it by its right-hand
    number (without, only a bare number counts: the table above)."""
    sample = RewardInput(text, [1], "20", prompt_text="What is 12 + 8?")
    assert resolve_reward("equation_form")(sample) == form
    assert resolve_reward("numeric_close")(sample, equation=True) == pytest.approx(close)


@pytest.mark.parametrize(
    ("text", "question", "form"),
    [
        ("12 + 8 = 19", "What is 12 + 8?", 1.0),  # the question restated, right or wrong
        ("12 + 8 = -3", "Calculate 12 + 8.", 1.0),
        ("12+8 = 20", "12 + 8 = ?", 1.0),  # whitespace aside
        ("1 = 5", "What is 12 + 8?", 0.0),  # an equation, but no restatement
        ("0 = 20", "What is 12 + 8?", 0.0),
        ("8 + 12 = 20", "What is 12 + 8?", 0.0),  # the operands in the question's order
        ("12 - 8 = 4", "What is 12 + 8?", 0.0),  # with its operator
        ("12 + 9 = 21", "What is 12 + 8?", 0.0),
        ("2 + 12 + 8 = 22", "What is 12 + 8?", 0.0),
        ("23 + 8 - 14 = 17", "What is 23 + 8 - 14?", 1.0),  # a chain, all of it
        ("23 + 8 = 31", "What is 23 + 8 - 14?", 0.0),
        # Without the question (a caller that passes no prompt_text): a left side of at
        # least two numbers worth the ground truth (20), whatever the right side says.
        ("12 + 8 = 19", "", 1.0),
        ("10 + 10 = 20", "", 1.0),
        ("12 + 9 = 20", "", 0.0),
        ("20 = 20", "", 0.0),
        ("1 = 5", "", 0.0),
    ],
)
def test_equation_form_pays_a_restatement_of_the_question(
    text: str, question: str, form: float
) -> None:
    """An equation ending in a number restates nothing by being one ("1 = 5", "0 = 42")."""
    sample = RewardInput(text, [1], "20", "arithmetic", prompt_text=question)
    assert resolve_reward("equation_form")(sample) == form


def test_the_default_job_pays_an_equation_that_restates_nothing_less_than_the_top() -> None:
    """For 20 + 22, "0 = 42" earned the whole 2.0 of the default job: numeric_match,
    numeric_close, equation_form and stopped. It restates nothing, so not equation_form."""
    reward = CombinedReward(load_config("default").rewards)
    for question in ("What is 20 + 22?", ""):
        bare = RewardInput("0 = 42", [1], "42", "arithmetic", question, "stop")
        restated = RewardInput("20 + 22 = 42", [1], "42", "arithmetic", question, "stop")
        assert reward(bare) == pytest.approx(1.75)
        assert reward(restated) == pytest.approx(2.0)


def test_numeric_close_same_sign_pays_nothing_across_zero() -> None:
    """The policy that cannot write a minus sign yet is not paid for "0" or "1" as the
    nearest non-negative answers to a result below zero."""
    close = resolve_reward("numeric_close")
    for text, truth, plain, signed in [
        ("3 - 6 = 1", "-3", 0.2, 0.0),
        ("3 - 6 = 0", "-3", 0.4, 0.0),  # zero is on the non-negative side
        ("3 - 6 = -5", "-3", 0.6, 0.6),
        ("5 - 3 = 0", "2", 0.6, 0.6),
        ("5 - 3 = -1", "2", 0.4, 0.0),
    ]:
        sample = RewardInput(text, [1], truth)
        assert close(sample, equation=True) == pytest.approx(plain), text
        assert close(sample, equation=True, same_sign=True) == pytest.approx(signed), text


def test_numeric_close_pays_near_misses_within_its_scale_and_bad_args_fail_at_load() -> None:
    close = resolve_reward("numeric_close")
    assert close(RewardInput("10", [1], "20"), scale=20.0) == pytest.approx(0.5)
    assert close(RewardInput("1,020", [1], "1000"), scale=40.0) == pytest.approx(0.5)
    check_rewards([RewardSpec(name="numeric_close", args={"scale": 3})])
    with pytest.raises(ConfigError, match="scale must be > 0"):
        check_rewards([RewardSpec(name="numeric_close", args={"scale": 0})])
    with pytest.raises(ConfigError, match=r"reward 'number_only' args \{'alon': True\}"):
        check_rewards([RewardSpec(name="number_only", args={"alon": True})])


def test_stopped_rewards_a_response_the_model_ended_itself() -> None:
    """The finish reason reaches the verifiers; a cut-off answer earns no completion reward."""
    reward = CombinedReward(
        [RewardSpec(name="numeric_match"), RewardSpec(name="stopped", weight=0.25)]
    )
    assert reward(RewardInput("22", [1], "22", finish_reason="stop")) == pytest.approx(1.25)
    assert reward(RewardInput("22\n\nAnswer with", [1] * 8, "22", finish_reason="length")) == 1.0
    assert reward(RewardInput("22", [1], "22")) == 1.0  # finish reason unknown
    after = CombinedReward(
        [RewardSpec(name="stopped", weight=0.25, args={"after": "numeric_match"})]
    )
    assert after(RewardInput("22", [1], "22", finish_reason="stop")) == 0.25
    assert after(RewardInput("9", [1], "22", finish_reason="stop")) == 0.0  # a wrong stop
    with pytest.raises(ConfigError, match="unknown reward 'nope'"):
        check_rewards([RewardSpec(name="stopped", args={"after": "nope"})])


def test_training_rewards_see_the_question_as_evaluation_does() -> None:
    """The generator scores with ``RewardInput.of`` (as evaluation does): a training prompt's
    question reaches ``equation_form``, so another equation worth the answer is not paid as a
    restatement."""
    from streamrl.data import PromptStream

    config = load_config("default")
    prompt = PromptStream(config.data, seed=0)[0]
    question = prompt.messages[-1]["content"]
    a, op, b = re.search(r"(-?\d+) ([-+*]) (-?\d+)", question).groups()
    assert RewardInput.of(prompt, "x", [1], "stop").prompt_text == question
    truth = prompt.ground_truth
    restated = RewardInput.of(prompt, f"{a} {op} {b} = {truth}", [1], "stop")
    other = RewardInput.of(prompt, f"{truth} + 0 = {truth}", [1], "stop")
    form = resolve_reward("equation_form")
    assert form(restated) == 1.0 and form(other) == 0.0
