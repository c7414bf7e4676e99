"""The generative judge (workers/reward_roles/judge.py): verdicts from one batched forward, numbers
from greedy generation on the hf and vllm engines, and what it refuses.

The random tiny model's verdicts mean nothing; what is checked on it is the mechanics (range,
batch invariance, unparsable items, template filling). One test asks the real SmolLM2 judge
about a right and a wrong answer.
"""

from __future__ import annotations

import re

import pytest

from streamrl.config import JudgeSpec
from streamrl.models import SMOLLM2, TINY, resolve_model
from streamrl.rewards.scorer import ScoreItem
from streamrl.workers.engines.registry import resolve_engine
from streamrl.workers.reward_roles.judge import JudgeScorer, fill_template, parse_number

ITEMS = [
    ScoreItem("What is 2 + 2?", "4", "4"),
    ScoreItem("Name a colour.", "Blue, obviously: it is the colour of the sky on a clear day.", ""),
    ScoreItem("What is 12 + 8?", "I think it is 21", "20"),
    ScoreItem("Say hi.", "hi", "hi"),
    ScoreItem("What is 30 - 4? Show your work, step by step, and then answer.", "26", "26"),
]


def _judge(**fields) -> JudgeScorer:
    spec = JudgeSpec(model=TINY, **fields)
    return JudgeScorer(spec, resolve_model(TINY), "judge-tiny")


@pytest.fixture(scope="module")
def verdict_judge() -> JudgeScorer:
    # A random 100-token model puts ~4% on Y/y/N/n: keep every verdict (mass threshold 0).
    return _judge(min_verdict_mass=0.0)


def test_identity_names_the_label_and_the_weights(verdict_judge: JudgeScorer) -> None:
    assert re.fullmatch(r"[0-9a-f]{12}", verdict_judge.weights_hash)
    assert verdict_judge.identity == f"judge-tiny@{verdict_judge.weights_hash}"


def test_verdicts_are_probabilities(verdict_judge: JudgeScorer) -> None:
    scores = verdict_judge.score(ITEMS)
    assert len(scores) == len(ITEMS)
    assert all(isinstance(s, float) and 0.0 <= s <= 1.0 for s in scores), scores
    assert len(set(scores)) > 1  # the items differ, so do their verdicts


def test_a_left_padded_batch_scores_as_each_item_alone(verdict_judge: JudgeScorer) -> None:
    batched = verdict_judge.score(ITEMS)
    alone = [verdict_judge.score([item])[0] for item in ITEMS]
    assert len({len(verdict_judge._encode(i)) for i in ITEMS}) == len(ITEMS)  # mixed lengths
    for b, a in zip(batched, alone, strict=True):
        assert b is not None and a is not None and abs(b - a) < 1e-4, (b, a)


def test_batches_smaller_than_the_call_score_the_same(verdict_judge: JudgeScorer) -> None:
    small = _judge(min_verdict_mass=0.0)
    small.batch_size = 2
    for a, b in zip(small.score(ITEMS), verdict_judge.score(ITEMS), strict=True):
        assert a is not None and b is not None and abs(a - b) < 1e-4


def test_a_bf16_judge_named_by_its_dtype_name_scores_probabilities() -> None:
    spec = JudgeSpec(model=TINY, min_verdict_mass=0.0)
    judge = JudgeScorer(spec, resolve_model(TINY), "judge-tiny", compute_dtype="bfloat16")
    assert all(s is not None and 0.0 <= s <= 1.0 for s in judge.score(ITEMS))


def test_a_verdict_below_the_mass_threshold_is_unparsable() -> None:
    judge = _judge(min_verdict_mass=0.999)
    assert judge.score(ITEMS) == [None] * len(ITEMS)


def test_braces_in_a_response_are_text_not_fields(verdict_judge: JudgeScorer) -> None:
    item = ScoreItem("Q {0}", "def f(): return {'a': 1} {prompt} {response} {", "{ground_truth}")
    template = "P={prompt} R={response} G={ground_truth} {other}"
    assert fill_template(template, item) == (
        "P=Q {0} R=def f(): return {'a': 1} {prompt} {response} { G={ground_truth} {other}"
    )
    (score,) = verdict_judge.score([item])
    assert score is not None and 0.0 <= score <= 1.0


def test_a_spelling_the_tokenizer_cannot_encode_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot be encoded") as err:
        _judge(yes_tokens=["Ÿes"])  # not in the character vocabulary
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="cannot be encoded"):
        _judge(no_tokens=[""])


def test_first_tokens_shared_by_yes_and_no_count_for_neither(verdict_judge) -> None:
    # The character tokenizer's " Yes" and " No" both begin with " ".
    tok = verdict_judge.tokenizer
    space = tok.encode(" ", add_special_tokens=False)[0]
    assert space not in verdict_judge.yes_ids and space not in verdict_judge.no_ids
    assert sorted(verdict_judge.yes_ids) == sorted(tok.convert_tokens_to_ids(["Y", "y"]))
    with pytest.raises(ValueError, match="same tokens"):
        _judge(yes_tokens=[" Yes"], no_tokens=[" No"])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7", 0.7),
        ("Score: 8/10", 0.8),
        ("-3", 0.0),  # clamped to low
        ("42 out of 10", 1.0),  # clamped to high
        ("+2.5 points", 0.25),
        ("I'd say 9.75.", 0.975),
        ("none", None),
        ("", None),
    ],
)
def test_parse_number(text: str, expected: float | None) -> None:
    got = parse_number(text, 0.0, 10.0)
    assert got == pytest.approx(expected) if expected is not None else got is None


def test_parse_number_maps_another_range() -> None:
    assert parse_number("3", 1.0, 5.0) == pytest.approx(0.5)
    assert parse_number("-10", -10.0, 10.0) == 0.0


def _number_judge_scores(engine: str, model: str, **resolve) -> list[float | None]:
    model_dir = resolve_model(model, **resolve)
    reason = resolve_engine(engine).unusable_reason(model_dir, "cpu")
    if reason:
        pytest.skip(reason)
    spec = JudgeSpec(model=model, score="number", engine=engine, max_new_tokens=8)
    judge = JudgeScorer(spec, model_dir, f"judge-{engine}")
    try:
        first = judge.score(ITEMS)
        assert judge.score(ITEMS) == first  # greedy: the same call scores the same
        return first
    finally:
        judge.shutdown()


def test_number_judge_on_the_hf_engine() -> None:
    scores = _number_judge_scores("hf", TINY)
    assert len(scores) == len(ITEMS)
    assert all(s is None or (isinstance(s, float) and 0.0 <= s <= 1.0) for s in scores)


@pytest.mark.slow  # vLLM starts its process group
def test_number_judge_on_the_vllm_engine() -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed (./scripts/setup.sh --with-vllm)")
    # Heads of 32: vLLM's CPU attention has no kernel below 32 (streamrl/models/tiny.py).
    scores = _number_judge_scores("vllm", TINY, tiny_hidden=128)
    assert len(scores) == len(ITEMS)
    assert all(s is None or (isinstance(s, float) and 0.0 <= s <= 1.0) for s in scores)


@pytest.mark.timeout(60)
def test_smollm2_judges_a_right_and_a_wrong_sum(capsys) -> None:
    model_dir = resolve_model(SMOLLM2)
    judge = JudgeScorer(JudgeSpec(model=SMOLLM2), model_dir, "judge-smollm2")
    right, wrong = judge.score(
        [
            ScoreItem("What is 12 + 8?", "12 + 8 = 20. The answer is 20.", "20"),
            ScoreItem("What is 12 + 8?", "12 + 8 = 18. The answer is 18.", "20"),
        ]
    )
    with capsys.disabled():
        print(f"\nSmolLM2 judge P(yes): right {right}, wrong {wrong}")
    assert right is not None and wrong is not None
    assert 0.0 <= right <= 1.0 and 0.0 <= wrong <= 1.0
