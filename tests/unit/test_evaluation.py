"""Held-out evaluation: the independent answer check and the disjoint arithmetic split."""

from __future__ import annotations

import itertools

import pytest

from streamrl.config import ConfigError, load_config
from streamrl.data import arithmetic_prompts, is_held_out
from streamrl.evaluation import eval_prompts, first_line_answer, format_table, score


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
