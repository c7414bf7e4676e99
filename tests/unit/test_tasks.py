"""The built-in tasks (streamrl.tasks): seeded streams, frozen held-out splits disjoint from
training, exact verifiers that refuse malformed and adversarial answers, and the shipped jobs."""

from __future__ import annotations

import json
import random
from fractions import Fraction
from pathlib import Path

import pytest

from streamrl.config import ConfigError, DataConfig, RewardSpec, load_config
from streamrl.data import DataError, PromptStream, check_data
from streamrl.evaluation import eval_prompts, exact_answer, job_for, score
from streamrl.rewards import CombinedReward, RewardInput
from streamrl.tasks import TASKS, countdown, expression, gsm
from streamrl.tasks.base import Prompt, held_out

ROOT = Path(__file__).resolve().parents[2]
NEW_TASKS = ("chain", "countdown", "gsm")


def _key(prompt: Prompt) -> str:
    """What makes two questions the same: for countdown the puzzle, in any order."""
    if prompt.data_source == "countdown":
        truth = json.loads(prompt.ground_truth)
        return f"{sorted(truth['numbers'])}:{truth['target']}"
    if prompt.data_source == "guess":  # the range and the hidden number
        return prompt.ground_truth
    return prompt.messages[-1]["content"]


@pytest.mark.parametrize("name", TASKS)
def test_question_i_is_the_same_for_the_same_seed(name: str) -> None:
    task, data = TASKS[name], DataConfig()
    for split in ("train", "eval"):
        first = [task.question(data, 5, i, split) for i in range(50)]
        assert first == [task.question(data, 5, i, split) for i in range(50)]
        assert [p.prompt_id.rsplit("-", 1)[1] for p in first] == [str(i) for i in range(50)]
        other_seed = [task.question(data, 6, i, split) for i in range(50)]
        assert [_key(p) for p in first] != [_key(p) for p in other_seed]
    stream = PromptStream(DataConfig(source=name), 5)
    assert stream[17] == task.question(data, 5, 17, "train")


def test_the_streams_are_pinned() -> None:
    """Question i comes from (seed, i) alone: these are what every machine draws."""
    data = DataConfig()
    assert TASKS["arithmetic"].question(data, 0, 3).messages[-1]["content"] == "What is 10 - 20?"
    assert TASKS["chain"].question(data, 0, 3).messages[-1]["content"] == "What is 2 + 17 + 3 + 20?"
    assert TASKS["chain"].question(data, 0, 3).ground_truth == "42"
    truth = json.loads(TASKS["countdown"].question(data, 0, 3).ground_truth)
    assert (truth["target"], truth["numbers"]) == (37, [11, 15, 2])
    assert TASKS["gsm"].question(data, 0, 3).ground_truth == "131"


@pytest.mark.parametrize("name", TASKS)
def test_the_held_out_split_is_disjoint_from_training(name: str) -> None:
    task, data = TASKS[name], DataConfig()
    train = {_key(task.question(data, seed, i)) for seed in (0, 1) for i in range(1500)}
    held_out = {_key(task.question(data, 10_007, i, "eval")) for i in range(200)}
    # arithmetic has 882 questions in all; guess 204 games (ranges 4 to 20, every number).
    least_held, least_train = (15, 150) if name == "guess" else (80, 700)
    assert len(held_out) > least_held and len(train) > least_train
    assert not train & held_out


def _commuted(question: str) -> tuple:
    """The test's own reading of what a chain question asks, in any order that keeps its value
    by commuting: a sum of signed products, each product's factors sorted. ``a - b`` and
    ``b - a`` differ; ``a + b`` and ``b + a``, ``2 * 3 + 4`` and ``4 + 3 * 2`` do not."""
    tokens = question.removeprefix("What is ").removesuffix("?").split()
    terms, sign, factors = [], 1, [int(tokens[0])]
    for op, number in zip(tokens[1::2], tokens[2::2], strict=True):
        if op == "*":
            factors.append(int(number))
        else:
            terms.append((sign, tuple(sorted(factors))))
            sign, factors = (1 if op == "+" else -1), [int(number)]
    terms.append((sign, tuple(sorted(factors))))
    return tuple(sorted(terms))


@pytest.mark.parametrize(("name", "terms"), [("arithmetic", 2), ("chain", 2), ("chain", 4)])
def test_a_commuted_held_out_question_is_never_a_training_question(name: str, terms: int) -> None:
    """``b + a`` is the question ``a + b``: both are held out or neither; the same for a
    chain's terms moved with their signs (``23 + 8 - 14`` is ``8 - 14 + 23``)."""
    task = TASKS[name]
    args = {"max_operand": 12, "operations": ["+", "-", "*"]}
    data = DataConfig(source=name, args=args | ({"terms": terms} if name == "chain" else {}))
    train = {_commuted(_key(task.question(data, seed, i))) for seed in (0, 1) for i in range(3000)}
    held_out = {_commuted(_key(task.question(data, 10_007, i, "eval"))) for i in range(300)}
    assert len(held_out) > 30
    assert not train & held_out


def test_subtraction_is_not_commuted_by_the_held_out_key() -> None:
    """``7 - 3`` and ``3 - 7`` are different questions (different answers): each its own key."""
    from streamrl.tasks.arithmetic import is_held_out

    pairs = [(a, b) for a in range(31) for b in range(a + 1, 31)]
    assert all(is_held_out(a, "+", b, 8) == is_held_out(b, "+", a, 8) for a, b in pairs)
    assert all(is_held_out(a, "*", b, 8) == is_held_out(b, "*", a, 8) for a, b in pairs)
    assert any(is_held_out(a, "-", b, 8) != is_held_out(b, "-", a, 8) for a, b in pairs)


def test_holding_nothing_out_leaves_nothing_to_evaluate() -> None:
    config = load_config(None, ["eval.source=chain", "data.holdout_every=0", "eval.max_prompts=2"])
    with pytest.raises(DataError, match="holdout_every is 0"):
        eval_prompts(config)
    # Every training question is then allowed.
    assert TASKS["chain"].question(config.data, 0, 0).data_source == "chain"


def test_a_question_space_too_small_for_the_split_fails_instead_of_looping() -> None:
    keys = [f"{a}+{b}" for a in (0, 1) for b in (0, 1)]  # every question of this setting
    every = next(e for e in range(2, 100) if not any(held_out(k, e) for k in keys))
    tiny = DataConfig(
        source="chain",
        args={"max_operand": 1, "terms": 2, "operations": ["+"]},
        holdout_every=every,
    )
    assert TASKS["chain"].question(tiny, 0, 0).ground_truth in "012"
    with pytest.raises(DataError, match="too small"):
        TASKS["chain"].question(tiny, 0, 0, "eval")


# --------------------------------------------------------------------------- chain


def test_chain_answers_follow_the_expression() -> None:
    data = DataConfig(
        source="chain", args={"terms": 5, "max_operand": 30, "operations": ["+", "-", "*"]}
    )
    for i in range(300):
        p = TASKS["chain"].question(data, 2, i)
        text = p.messages[-1]["content"].removeprefix("What is ").removesuffix("?")
        assert len(text.split()) == 9  # five operands, four operations
        tree = expression.parse(text)
        assert tree is not None and str(expression.value(tree)) == p.ground_truth
        assert p.messages[0]["content"] == "Answer with the number only."


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("42", True),
        ("42\nbecause", True),
        ("The answer is 42.", True),
        ("2 + 40 = 42", True),  # an equation answers with its right-hand side
        ("42 + 1 = 43", False),  # not with its first number
    ],
)
def test_chain_is_checked_by_the_first_line(response: str, expected: bool) -> None:
    p = TASKS["chain"].question(DataConfig(), 0, 3)
    assert p.ground_truth == "42"
    assert exact_answer(p, response) is expected


# --------------------------------------------------------------------------- countdown


def _puzzle(target: int, numbers: list[int]) -> str:
    return json.dumps({"target": target, "numbers": numbers})


@pytest.mark.parametrize(
    ("response", "solved"),
    [
        ("(25 - 3) * 2", True),
        ("2 * (25 - 3)", True),
        ("(25-3)*2 = 44", True),  # a trailing "= target" is allowed
        ("  (25 - 3) * 2.\nThat uses 25, 3 and 2.", True),
        ("(25 − 3) × 2", True),  # typographic minus and times
        ("(25 - 3) * 2 + 0", False),  # 0 is not given
        ("25 + 25 - 6", False),  # 25 used twice, 6 not given
        ("(25 - 3) * 2 * 1", False),  # 1 not given
        ("25 + 3 + 2", False),  # legal, misses the target
        ("44", False),  # a number not given
        ("", False),
        ("I don't know", False),
        ("(25 - 3) * 2 )", False),
        ("(25 - 3) ** 2", False),
        ("2**99999", False),
        ("9**9**9**9", False),
        ("(25 - 3) // 2 * 4", False),
        ("-(3 - 25) * 2", False),  # no unary minus
        ("__import__('os').system('true')", False),
        ("0x2C", False),
        ("4_4", False),
        ("44.0", False),
        ("(" * 150 + "2" + ")" * 150, False),
        ("1" * 5000, False),
    ],
)
def test_countdown_verifier(response: str, solved: bool) -> None:
    truth = _puzzle(44, [25, 3, 2, 7])
    assert countdown.solves(response, truth) is solved
    prompt = Prompt("c", [], truth, "countdown")
    assert exact_answer(prompt, response) is solved


def test_countdown_divides_exactly_and_refuses_division_by_zero() -> None:
    assert countdown.solves("(7 + 1) / 2", _puzzle(4, [7, 1, 2]))
    assert countdown.solves("7 / 2 * 2", _puzzle(7, [7, 2, 2]))  # fractions, not floats
    assert not countdown.solves("7 / 2", _puzzle(3, [7, 2]))  # 3.5, not 3
    assert not countdown.solves("7 / (2 - 2)", _puzzle(7, [7, 2, 2]))
    assert countdown.grade("7 / (2 - 2)", _puzzle(7, [7, 2, 2])) == (True, False)
    assert expression.value(expression.parse("1 / 3 + 1 / 6")) == Fraction(1, 2)


@pytest.mark.parametrize(
    "truth",
    [
        "",
        "44",
        "{}",
        '{"target": 44}',
        '{"target": "44", "numbers": [44]}',
        "[1, 2]",
        "null",
        '{"target": 44, "numbers": [25, "3"]}',
        '{"target": true, "numbers": [1]}',
    ],
)
def test_a_malformed_countdown_ground_truth_scores_zero(truth: str) -> None:
    assert countdown.grade("25 + 19", truth) == (False, False)


def test_countdown_grading_never_raises_on_garbage() -> None:
    rng = random.Random(0)
    alphabet = "0123456789+-*/() .=\n*xX^%e_abc'\"[]{}×÷−"
    truth = _puzzle(24, [4, 6, 1, 3])
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        legal, solved = countdown.grade(text, truth)
        assert isinstance(legal, bool) and isinstance(solved, bool)
        assert not solved or legal


def test_generated_countdown_puzzles_are_solvable() -> None:
    for data in (
        DataConfig(source="countdown"),
        DataConfig(source="countdown", args={"numbers": 4, "max_operand": 25}),
    ):
        for split in ("train", "eval"):
            for i in range(300):
                p = TASKS["countdown"].question(data, 1, i, split)
                truth = json.loads(p.ground_truth)
                assert len(truth["numbers"]) == data.args.get("numbers", 3)
                assert all(1 <= n <= data.args.get("max_operand", 20) for n in truth["numbers"])
                assert 1 <= truth["target"] <= 100
                assert truth["target"] not in truth["numbers"]
                assert countdown.solves(truth["solution"], p.ground_truth), truth
                user = p.messages[-1]["content"]
                assert ", ".join(map(str, truth["numbers"])) in user
                assert f"make {truth['target']}." in user


def test_a_cramped_countdown_setting_still_draws_solvable_puzzles() -> None:
    data = DataConfig(source="countdown", args={"max_operand": 2, "numbers": 2, "max_target": 1})
    for i in range(50):
        p = TASKS["countdown"].question(data, 0, i)
        assert countdown.solves(json.loads(p.ground_truth)["solution"], p.ground_truth)


def test_countdown_reward() -> None:
    reward = CombinedReward([RewardSpec(name="countdown", args={"format_score": 0.2})])
    truth = _puzzle(44, [25, 3, 2])

    def r(text: str) -> float:
        return reward(RewardInput(text, [1], truth, "countdown"))

    assert r("(25 - 3) * 2") == 1.0
    assert r("25 + 3 + 2") == 0.2  # legal, wrong
    assert r("25 + 25") == 0.0  # 25 twice
    assert r("25") == 0.0  # one number is no expression
    assert r("2**99999") == 0.0
    assert r("banana") == 0.0
    assert reward(RewardInput("1 + 2", [1], "not json", "countdown")) == 0.0
    assert reward.errors == 0


# --------------------------------------------------------------------------- gsm


def test_gsm_problems_are_filled_in_and_ask_for_the_gsm8k_form() -> None:
    for i in range(300):
        p = TASKS["gsm"].question(DataConfig(), 4, i)
        assert int(p.ground_truth) > 0 and str(int(p.ground_truth)) == p.ground_truth
        user = p.messages[-1]["content"]
        assert "{" not in user and "}" not in user and user.endswith("?")
        assert "####" in p.messages[0]["content"]


def test_gsm_answers_are_right() -> None:
    """Each template's answer, recomputed from its question's numbers; every template is
    drawn."""
    seen = set()
    for i in range(400):
        p = TASKS["gsm"].question(DataConfig(), 9, i)
        user = p.messages[-1]["content"]
        n = [int(w.strip("$.,?")) for w in user.split() if w.strip("$.,?").isdigit()]
        if "change" in user:
            expected = n[2] - n[0] * n[1]
        elif "bags with" in user:
            expected = n[0] + n[1] * n[2] - n[3]
        elif "per hour." in user and "earns" in user:
            expected = n[0] * (n[1] + n[2])
        elif "trays" in user:
            expected = n[0] * n[1] // n[2]
            assert n[0] * n[1] % n[2] == 0
        elif "km per hour" in user:
            expected = n[0] * n[1] + n[2] * n[3]
        elif "times as many" in user:
            expected = n[0] + n[0] * n[1] + n[0] * n[1] - n[2]
        else:
            assert "saves" in user
            expected = n[0] * n[1] - n[2]
        assert p.ground_truth == str(expected), user
        seen.add(
            next(
                k for k in ("change", "bags", "earns", "trays", "km", "times", "saves") if k in user
            )
        )
    assert len(seen) == len(gsm.TEMPLATES) == 7


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("4 pens cost 4 * 3 = 12 dollars. 20 - 12 = 8.\n#### 8", True),
        ("#### 8.", True),
        ("####8", True),
        ("#### 8.0", True),
        ("20 - 12 = 8\n#### 9", False),
        ("The answer is 8.", False),  # no ####
        ("#### eight", False),
        ("#### 8\n#### 9", True),  # the first ####, as the gsm8k reward reads
        ("", False),
    ],
)
def test_gsm_exact_check(response: str, expected: bool) -> None:
    assert exact_answer(Prompt("g", [], "8", "gsm"), response) is expected
    assert exact_answer(Prompt("g", [], "#### 8", "gsm"), response) is expected


def test_gsm_reads_thousands_and_the_gsm8k_reward_agrees() -> None:
    assert gsm.final_answer("so #### 1,234", "1234")
    reward = CombinedReward([RewardSpec(name="gsm8k", args={"format_score": 0.2})])
    assert reward(RewardInput("x\n#### 1,234", [1], "1234")) == 1.0
    assert reward(RewardInput("x\n#### 12", [1], "1234")) == 0.2
    assert reward(RewardInput("1234", [1], "1234")) == 0.0


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("She sold 48 in April and 24 in May.\n48 + 24 = 72\n#### 72", True),
        ("72", False),  # GSM8K's answer follows ####: a bare first line is not it
        ("48 + 24 = 72", False),
        ("#### 71", False),
    ],
)
def test_a_verl_gsm8k_file_is_checked_after_its_hashes(
    tmp_path: Path, response: str, expected: bool
) -> None:
    """verl's GSM8K preprocessing names its rows ``openai/gsm8k`` with the bare number as the
    ground truth; the exact check is then GSM8K's (after ``####``), not the first line's."""
    path = tmp_path / "gsm8k_test.jsonl"
    row = {
        "prompt": [{"role": "user", "content": "Natalia sold 48 clips... step by step"}],
        "reward_model": {"style": "rule", "ground_truth": "72"},
        "data_source": "openai/gsm8k",
    }
    path.write_text(json.dumps(row) + "\n")
    config = load_config(None, [f"eval.source={path}"])
    (prompt,) = eval_prompts(config)
    assert exact_answer(prompt, response) is expected


# --------------------------------------------------------------------------- configs and eval


@pytest.mark.parametrize(
    ("name", "tokens"), [("chain", (4, 16)), ("countdown", (24, 32)), ("gsm", (96, 128))]
)
def test_the_shipped_task_jobs_load(name: str, tokens: tuple[int, int]) -> None:
    config = load_config(ROOT / "configs" / f"{name}.yaml")
    assert config.data.source == config.eval.source == name
    assert config.model.name == "smollm2-135m-instruct"
    assert tokens[0] <= config.generator.max_new_tokens <= tokens[1]
    assert 64 <= config.eval.max_prompts <= 128 and config.eval.every > 0
    assert len(config.rewards) >= 1
    check_data(config)
    assert load_config(name).data.source == name  # by name, as `streamrl launch chain`


@pytest.mark.parametrize("name", NEW_TASKS)
def test_eval_prompts_and_score_per_task(name: str) -> None:
    config = load_config(ROOT / "configs" / f"{name}.yaml", ["eval.max_prompts=6"])
    prompts = eval_prompts(config)
    assert len(prompts) == 6 and prompts == eval_prompts(config)
    assert all(p.data_source == name for p in prompts)

    def right(p: Prompt) -> str:
        if name == "countdown":
            return json.loads(p.ground_truth)["solution"]
        return f"Step.\n#### {p.ground_truth}" if name == "gsm" else p.ground_truth

    responses = [(right(p), [1], "stop") for p in prompts[:3]]
    responses += [(right(prompts[3]), [1], "length"), ("no idea", [1], "stop")]
    responses += [("banana", [1], "stop")]
    metrics = score(config, prompts, responses, version=3).metrics
    assert metrics["eval/exact_match"] == pytest.approx(4 / 6)
    assert metrics["eval/completed"] == pytest.approx(3 / 6)
    # The top reward includes `stopped`, for a right answer the model ended.
    assert metrics["eval/accuracy"] == pytest.approx(3 / 6)


def test_streamrl_eval_takes_the_task_job_for_a_task() -> None:
    """`streamrl eval MODEL --data countdown` runs with configs/countdown.yaml's settings."""
    assert Path(job_for(["eval.source=countdown"])).name == "countdown.yaml"
    assert Path(job_for(["eval.source=gsm", "eval.max_prompts=4"])).name == "gsm.yaml"
    assert Path(job_for(["eval.source=arithmetic"])).name == "default.yaml"
    assert Path(job_for([])).name == "default.yaml"
    assert Path(job_for(["eval.source=tiny"])).name == "default.yaml"  # a job, not a task


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "data.source=chain data.args.terms=1",
            "data.args for chain: terms must be in \\[2, 12\\]",
        ),
        ("data.source=chain data.chain_terms=13", "terms must be in \\[2, 12\\]"),  # moved key
        ("data.source=countdown data.args.numbers=1", "numbers must be in \\[2, 6\\]"),
        ("data.source=countdown data.args.numbers=7", "numbers must be in \\[2, 6\\]"),
        ("data.source=countdown data.args.max_target=0", "max_target must be >= 1"),
        ("data.args.max_operand=0", "max_operand must be >= 1"),
        ("data.args.operations=[]", "operations must name at least one"),
        ("data.source=chain data.args.terms=four", "Expected `int`, got `str` - at `terms`"),
        ("data.args.chain_terms=4", "unknown key `chain_terms` \\(this task's: max_operand"),
        ("data.source=x.jsonl data.args.terms=4", "data.args is for a built-in task"),
        ("data.holdout_every=0 eval.every=5", "has no held-out questions"),
    ],
)
def test_bad_task_knobs_fail_with_one_line(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        check_data(load_config(None, override.split()))
    assert "\n" not in str(info.value)


def test_an_unknown_task_name_is_refused_listing_the_tasks() -> None:
    config = load_config(None, ["data.source=countdwn", "eval.every=0"])
    with pytest.raises(DataError, match=r"not a built-in task \(arithmetic, chain, countdown, gsm"):
        check_data(config)
