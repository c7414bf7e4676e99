"""Held-out evaluation: the independent answer check and the disjoint arithmetic split."""

from __future__ import annotations

import itertools

import pytest

from streamrl.config import ConfigError, load_config, shipped_config
from streamrl.data import arithmetic_prompts, is_held_out
from streamrl.evaluation import eval_prompts, first_line_answer, format_table, score
from streamrl.rewards import RewardInput, resolve_reward


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("7", "7", True),
        (" 7.\nbecause 3 + 4", "7", True),
        ("\n\n-5", "-5", True),
        ("3 + 4 = 7", "7", True),  # an equation answers with its right-hand side
        ("7 + 0 = 8", "7", False),  # not with its first number
        ("3 + 4 =", "7", False),
        ("3 - 10 = -7.", "-7", True),
        ("The answer is 7", "7", True),  # the first number on the first line
        ("The answer:\n7", "7", False),  # not on the first non-empty line
        ("", "7", False),
        ("7.0", "7", True),
        ("Paris", "Paris", True),
        ("Paris is it", "Paris", False),
    ],
)
def test_first_line_answer(response: str, truth: str, expected: bool) -> None:
    assert first_line_answer(response, truth) is expected


def _questions(prompts) -> set[str]:
    return {p.messages[-1]["content"] for p in prompts}


def test_eval_split_is_disjoint_from_training() -> None:
    config = load_config(None, ["data.max_operand=30"])
    train: set[str] = set()
    for seed, stream in itertools.product((0, 1), (0, 1)):
        source = arithmetic_prompts(config.data, seed, stream, 2)
        train |= _questions(itertools.islice(source, 2000))
    held_out = _questions(
        eval_prompts(load_config(None, ["data.max_operand=30", "eval.max_prompts=200"]))
    )
    assert len(held_out) > 100 and len(train) > 1000
    assert not train & held_out
    # About one question in eight is held out.
    everything = [(a, op, b) for a in range(31) for b in range(31) for op in "+-"]
    share = sum(is_held_out(a, op, b, 8) for a, op, b in everything) / len(everything)
    assert 0.09 < share < 0.16


def _asked(prompt) -> tuple:
    """An arithmetic question as what it asks: ``b + a`` is ``a + b``, ``b - a`` is not."""
    a, op, b = prompt.messages[-1]["content"].removeprefix("What is ").rstrip("?").split()
    return (op, *sorted((int(a), int(b)))) if op in "+*" else (op, int(a), int(b))


def test_the_default_jobs_held_out_questions_are_distinct() -> None:
    """Drawn without replacement: the default job's 128 eval prompts are 128 questions (they
    were 91, drawn with replacement, so its n was ~76, not 128)."""
    prompts = eval_prompts(load_config(shipped_config("default")))
    assert len(prompts) == 128 and len({_asked(p) for p in prompts}) == 128
    unseen = __import__("streamrl.evaluation").evaluation.unseen_phrasing_prompts(
        load_config(shipped_config("default"))
    )
    assert [p.ground_truth for p in unseen] == [p.ground_truth for p in prompts]


def test_asking_for_more_held_out_questions_than_exist_evaluates_all_of_them(caplog) -> None:
    """Operands up to 3: 16 sums (10 distinct) and 16 differences; a few are held out. Asked
    for 100, the evaluation gets every held-out question once, and says so."""
    config = load_config(None, ["data.max_operand=3", "eval.max_prompts=100"])
    every = config.data.holdout_every
    held = {
        (op, *sorted((a, b))) if op == "+" else (op, a, b)
        for a in range(4)
        for b in range(4)
        for op in "+-"
        if is_held_out(a, op, b, every)
    }
    with caplog.at_level("WARNING"):
        prompts = eval_prompts(config)
    assert sorted(_asked(p) for p in prompts) == sorted(held)
    assert f"only {len(held)} distinct held-out questions" in caplog.text


def test_eval_prompts_are_the_same_every_time() -> None:
    config = load_config(None, ["eval.max_prompts=16"])
    assert eval_prompts(config) == eval_prompts(config)


def test_format_table() -> None:
    table = format_table(
        {
            "base": {
                "eval/exact_match": 0.25,
                "eval/accuracy": 0.5,
                "eval/reward_mean": 0.6,
                "eval/prompts": 8.0,
            }
        }
    )
    assert "exact_match" in table and "0.250" in table and "base" in table


def test_the_unseen_phrasing_asks_the_same_held_out_questions_in_another_wording():
    from streamrl.evaluation import UNSEEN, unseen_phrasing_prompts

    config = load_config(None, ["eval.max_prompts=8"])
    usual, unseen = eval_prompts(config), unseen_phrasing_prompts(config)
    assert [p.ground_truth for p in unseen] == [p.ground_truth for p in usual]
    assert all(p.messages[0]["role"] == "system" for p in usual)
    # No system prompt, and a wording training never uses.
    assert all([m["role"] for m in p.messages] == ["user"] for p in unseen)
    assert all(p.messages[0]["content"].startswith("Compute ") for p in unseen)
    assert unseen_phrasing_prompts(load_config(None, ['eval.unseen_phrasing=""'])) == []
    with pytest.raises(ConfigError, match="eval.unseen_phrasing must use exactly the fields"):
        load_config(None, ["eval.unseen_phrasing=Add {a} and {b}"])
    table = format_table({"m": {"eval/exact_match": 0.5, UNSEEN + "exact_match": 0.25}})
    assert "unseen_exact" in table.splitlines()[0] and "0.250" in table


def test_completed_counts_only_exact_answers_that_stopped_on_their_own() -> None:
    """A right first line cut off by the token limit is exact but not completed."""
    config = load_config(None, ["eval.max_prompts=4"])
    prompts = eval_prompts(config)[:3]
    truth = [p.ground_truth for p in prompts]
    responses = [
        (truth[0], [1], "stop"),  # right, stopped: completed
        (f"{truth[1]}\nand then some", [1, 2], "length"),  # right first line, cut off
        ("no idea", [3], "stop"),  # stopped, wrong
    ]
    metrics = score(config, prompts, responses, version=0).metrics
    assert metrics["eval/exact_match"] == pytest.approx(2 / 3)
    assert metrics["eval/completed"] == pytest.approx(1 / 3)


# The stated answer, as the held-out check and the training rewards read it: one table, both
# readers. (response, ground truth, is it that answer?)
STATED_ANSWERS = [
    ("7", "7", True),
    (" 7.\nbecause 3 + 4", "7", True),
    ("The answer is 7", "7", True),  # the first number of the first line
    ("The answer:\n7", "7", False),  # not a number of a later line
    ("3 + 4 = 7", "7", True),  # an equation states its right-hand side
    ("7 + 0 = 8", "7", False),
    ("3 + 4 =", "7", False),
    ("3 - 10 = -7.", "-7", True),
    ("-7", "-7", True),
    ("+42", "42", True),  # a sign is part of the number, "+" as "-"
    ("40 + 2 = +42", "42", True),
    ("4,2", "42", False),  # a comma separates thousands only
    ("1,024", "1024", True),
    ("1,024", "1,024", True),
    ("10,24", "1024", False),
    ("42.0", "42", True),
    ("42.0000001", "42", False),  # exact, no tolerance
    ("41.9999999", "42", False),
    ("", "7", False),
]


@pytest.mark.parametrize(("response", "truth", "expected"), STATED_ANSWERS)
def test_the_check_and_the_rewards_read_the_same_stated_answer(
    response: str, truth: str, expected: bool
) -> None:
    """``first_line_answer`` (evaluation) and ``numeric_match`` (training) are kept in separate
    code, so that a reward bug cannot inflate the eval, but must agree on every case."""
    assert first_line_answer(response, truth) is expected
    paid = resolve_reward("numeric_match")(RewardInput(response, [1], truth))
    assert paid == (1.0 if expected else 0.0)


def test_the_eval_rewards_see_the_question() -> None:
    """``score`` passes the question to the verifiers: ``equation_form`` pays "12 + 8 = 20"
    for "What is 12 + 8?", not "8 + 12 = 20" (which, without the question, it would)."""
    config = load_config(shipped_config("default"))
    prompt = next(
        p for p in eval_prompts(config) if " + " in p.messages[-1]["content"] and _asked(p)[1] > 0
    )
    a, _, b = prompt.messages[-1]["content"].removeprefix("What is ").rstrip("?").split()
    assert a != b
    truth = prompt.ground_truth
    responses = [(f"{a} + {b} = {truth}", [1], "stop"), (f"{b} + {a} = {truth}", [1], "stop")]
    rewards = [s["reward"] for s in score(config, [prompt] * 2, responses, 0).samples]
    assert rewards == [pytest.approx(2.0), pytest.approx(1.75)]
