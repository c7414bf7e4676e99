"""The built-in rule rewards, each registered by its name (``streamrl.rewards`` lists them).

The answer a response states (``stated_number``) is the one the held-out check reads
(``evaluation.first_line_answer``), in code of its own so that a bug here cannot inflate the
eval: the first non-empty line's number after its last ``=`` when the line is an equation,
else the line's first number; a number has an optional ``+``/``-``, commas only between
groups of three digits, and is compared exactly. ``tests/unit/test_evaluation.py`` runs both
over one table. Where a reward reads more on purpose it says so (``numeric_match``'s
``partial``, ``numeric_close``'s near misses).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from streamrl.rewards.base import RewardInput, register, resolve_reward
from streamrl.rewards.math_answers import boxed_answer, gsm8k_answer, math_equal
from streamrl.tasks import countdown as countdown_task
from streamrl.tasks import expression
from streamrl.tasks import reasoning_gym as gym_task

# "-7", "+42", "1,024", "2.5"; "4,2" is the number 4 (module doc).
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")


def _to_number(text: str) -> Fraction | None:
    """The exact value of a number as ``_NUMBER`` reads it, else None."""
    match = _NUMBER.fullmatch(text.strip())
    return Fraction(match.group().replace(",", "")) if match else None


def _numbers_equal(candidate: str | None, truth: str) -> bool:
    """Equal as numbers, exactly (``42.0`` is 42, ``42.0000001`` is not), else as text."""
    if candidate is None:
        return False
    a, b = _to_number(candidate), _to_number(truth)
    if a is None or b is None:
        return candidate.strip() == truth.strip()
    return a == b


_LEADING_NUMBER = re.compile(rf"\s*({_NUMBER.pattern})")


def _first_line(text: str) -> str:
    return next((part for part in text.splitlines() if part.strip()), "")


def stated_number(text: str) -> str | None:
    """The number a response gives as its answer (module doc): when its first non-empty line
    is an equation, the number right after the line's last ``=`` (``"12 + 8 = 20"`` ->
    ``"20"``; ``"12 + 8 ="`` -> None, though 12 comes first); otherwise the first number of
    that line (``"The answer:\n7"`` states none)."""
    line = _first_line(text)
    if "=" in line:
        match = _LEADING_NUMBER.match(line.rsplit("=", 1)[1])
        return match.group(1) if match else None
    match = _NUMBER.search(line)
    return match.group() if match else None


@register("numeric_match")
def numeric_match(sample: RewardInput, *, partial: float = 0.0) -> float:
    """1 if the number the response states (``stated_number``: the first line's first, or an
    equation's right-hand side) equals the ground truth: the held-out check's reading;
    ``partial`` if the answer is any other number of the response (keeps a small gradient for
    chatty models; the check gives no such credit), else 0."""
    if _numbers_equal(stated_number(sample.response_text), sample.ground_truth):
        return 1.0
    numbers = _NUMBER.findall(sample.response_text)
    return partial if any(_numbers_equal(n, sample.ground_truth) for n in numbers) else 0.0


_BARE_NUMBER = re.compile(rf"\s*{_NUMBER.pattern}\s*(?:\n|$)")


@register("number_only")
def number_only(sample: RewardInput, *, alone: bool = False) -> float:
    """1 if the response's first line is a number and nothing else, right or wrong: a format
    reward (as DeepSeek-R1's) that gives a chatty model's groups variance before any answer is
    right. Weighted below ``numeric_match``, it teaches the form and ``numeric_match`` the
    content. With ``alone`` the whole response must be the number: a policy paid for the first
    line alone learned to write on after it ("19\n\nAnswer with the number only...") to the
    token limit."""
    pattern = _ALONE_NUMBER if alone else _BARE_NUMBER
    return 1.0 if pattern.match(sample.response_text) else 0.0


_ALONE_NUMBER = re.compile(rf"\s*{_NUMBER.pattern}\s*$")
# Arithmetic (digits, spaces, operators, brackets) = a number: "12 + 8 = 20", "(3 - 5) = -2".
_EQUATION = re.compile(rf"([\d\s.,+\-*/×÷()]+)=\s*({_NUMBER.pattern})\s*")


def _equation(text: str, alone: bool) -> tuple[str, str] | None:
    """(left side, right-hand number) of an arithmetic equation that is the response
    (``alone``) or its first line, else None."""
    match = _EQUATION.fullmatch(text if alone else _first_line(text))
    if match is None or not any(c.isdigit() for c in match.group(1)):
        return None
    return match.group(1), match.group(2)


def _answer_equation(text: str, alone: bool) -> str | None:
    """The right-hand number of an arithmetic equation (``_equation``), else None."""
    equation = _equation(text, alone)
    return equation[1] if equation else None


# The arithmetic a question asks: "What is 12 + 8?" -> "12 + 8"; "23 + 8 - 14 + 6".
_QUESTION = re.compile(r"\d+(?:\s*[-+*]\s*\d+)+")


def _restates(left: str, sample: RewardInput) -> bool:
    """Whether an equation's left side restates the question (``equation_form``)."""
    asked = _QUESTION.search(sample.prompt_text)
    if asked is not None:
        return "".join(left.split()) == "".join(asked.group().split())
    # No question given: arithmetic of at least two numbers worth the ground truth.
    tree = expression.parse(left)
    if tree is None or len(expression.numbers(tree)) < 2:
        return False
    return expression.value(tree) == _to_number(sample.ground_truth)


@register("equation_form")
def equation_form(sample: RewardInput, *, alone: bool = True) -> float:
    """1 if the response restates the question as an equation that ends in a number, right or
    wrong ("12 + 8 = 19" for "What is 12 + 8?"; ``alone``: nothing after it, else its first
    line): the default job's format reward. The left side must be the question's arithmetic,
    its numbers in its order with its operators, spaces aside ("12+8 = 19" counts, "8 + 12 =
    20" and "1 = 5" do not: paid for any equation, "0 = 42" earned the whole top reward).
    The question is ``RewardInput.prompt_text``; a caller that does not pass it gets the rule
    that needs none: a left side of at least two numbers whose value is the ground truth.
    SmolLM2 drifts to restating the question this way, and computes far better when it does:
    its greedy answers after "a op b =" got 35 of the 106 held-out questions whose result is
    >= 0 right, its bare first answers 1, and it writes a minus sign after "=" about 50 times
    as often as at the start of a reply. Paying a bare number instead (``number_only``) left
    the job near 50% held-out (``configs/default.yaml``)."""
    equation = _equation(sample.response_text, alone)
    return 1.0 if equation is not None and _restates(equation[0], sample) else 0.0


@register("numeric_close")
def numeric_close(
    sample: RewardInput, *, scale: float = 5.0, equation: bool = False, same_sign: bool = False
) -> float:
    """Credit for a near miss: ``1 - |answer - truth| / scale`` (at least 0) when the whole
    response is a number, else 0. Why: on a task the model rarely gets right (three-term sums),
    a group's answers are all wrong and ``numeric_match`` gives it no variance, so dynamic
    sampling drops nearly every group and the run learns from almost nothing. Paying the nearer
    answers more gives those groups a direction toward the right one. Only a bare number
    counts, or with ``equation`` an arithmetic equation that is the whole response, by its
    right-hand number ("12 + 8 = 19" as 19): scored on a chatty response's first number,
    restating the question would pay for an operand near the answer. With ``same_sign`` an
    answer on the other side of zero earns nothing: paid for nearness alone, a policy that
    cannot yet write a minus sign learns "0" or "1" for every result below zero."""
    if scale <= 0:
        raise ValueError(f"numeric_close: scale must be > 0, got {scale}")
    text = sample.response_text
    stated = _answer_equation(text, alone=True) if equation else None
    if stated is None and not _ALONE_NUMBER.match(text):
        return 0.0
    answer, truth = _to_number(stated or text), _to_number(sample.ground_truth)
    if answer is None or truth is None or (same_sign and (answer < 0) != (truth < 0)):
        return 0.0
    return max(0.0, 1.0 - abs(answer - truth) / scale)


@register("stopped")
def stopped(
    sample: RewardInput, *, after: str = "", after_args: dict[str, Any] | None = None
) -> float:
    """1 if the model ended the response itself (a stop token), 0 if it was cut off at the
    token limit. With ``after`` (a registered reward, e.g. ``numeric_match``) only when that
    reward is 1 too: a right answer that the model finished.

    Why: with a reward for the answer alone, the default job's policy kept writing after the
    right number until the limit ("19\n\nAnswer with the number only...": exact 39%,
    completed 0%). Rewarding any stop instead was hacked within 20 steps: one digit and a
    stop token, right or not (0.5 of the 1.5 on offer), until every group agreed on a wrong
    digit and dynamic sampling dropped them all. So the stop pays only after a right answer.
    ``after_args``: that reward's keyword arguments, as its own ``rewards:`` entry gives them."""
    if sample.finish_reason != "stop":
        return 0.0
    if not after:
        return 1.0
    return 1.0 if resolve_reward(after)(sample, **(after_args or {})) >= 1.0 else 0.0


@register("gsm8k")
def gsm8k(sample: RewardInput, *, format_score: float = 0.0) -> float:
    """GSM8K style: the answer is the number after the first ``####``
    (``math_answers.gsm8k_answer``); 1 if it equals the ground truth's (after its last ``####``,
    or all of it) by ``math_answers.math_equal`` (two numbers exactly: ``1,000`` is ``1000``),
    ``format_score`` if it does not, 0 with no ``####`` number. Needs math-verify."""
    answer = gsm8k_answer(sample.response_text)
    if answer is None:
        return 0.0
    truth = sample.ground_truth.split("####")[-1]
    return 1.0 if math_equal(answer, truth) else format_score


@register("countdown")
def countdown(sample: RewardInput, *, format_score: float = 0.0) -> float:
    """The countdown task (``streamrl.tasks.countdown``): 1 if the first line is an
    expression of the given numbers, each used at most once, with ``+ - * /`` and parentheses,
    equal to the target; ``format_score`` if it is such an expression of at least two given
    numbers but misses the target (a format reward, as ``gsm8k``'s); else 0, malformed answers
    and ground truths included. Read without ``eval``: ``2**99999`` is malformed."""
    legal, solved = countdown_task.grade(sample.response_text, sample.ground_truth)
    return 1.0 if solved else format_score if legal else 0.0


@register("boxed_math")
def boxed_math(sample: RewardInput) -> float:
    """1 if the response's last ``\\boxed{...}`` equals the ground truth (its own last box, or
    all of it) by ``math_answers.math_equal`` (math-verify: ``0.5`` is ``\\frac12``), else 0.
    Needs math-verify."""
    answer = boxed_answer(sample.response_text)
    if answer is None:
        return 0.0
    truth = boxed_answer(sample.ground_truth) or sample.ground_truth
    return 1.0 if math_equal(answer, truth) else 0.0


@register("exact_match")
def exact_match(sample: RewardInput, *, strip: bool = True) -> float:
    response, truth = sample.response_text, sample.ground_truth
    if strip:
        response, truth = response.strip(), truth.strip()
    return 1.0 if response == truth else 0.0


@register("target_token_share")
def target_token_share(sample: RewardInput, *, token_id: int) -> float:
    """Share of response tokens equal to ``token_id``: a trivially learnable signal for tests."""
    if not sample.response_ids:
        return 0.0
    return sum(1 for t in sample.response_ids if t == token_id) / len(sample.response_ids)


@register("countdown_close")
def countdown_close(
    sample: RewardInput, *, scale: float = 20.0, partial: float = 0.0, falloff: str = "linear"
) -> float:
    """Credit for a countdown answer that misses: ``partial + (1 - partial) * closeness`` for a
    legal expression, and for one that is not legal ``partial`` times the share of the given
    numbers it uses (each once; a number not given cancels one used). Closeness, with ``d =
    |value - target|``: ``linear`` ``max(0, 1 - d / scale)``; ``inverse`` ``scale / (scale +
    d)``, which never reaches 0, so that of two legal misses the nearer always earns more.
    Read as the puzzle's own verifier reads it (reasoning-gym's as countdown_gym does: an
    ``<answer>`` tag, else the first line before any ``=``; the built-in task's by
    ``countdown.answer_line``), valued without ``eval`` (``tasks.expression``). Legal: every
    given number exactly once for a reasoning-gym puzzle (its rule), each at most once for the
    built-in task's.

    Why: reasoning-gym's verifier pays 0.05 for anything it can parse that is not a solution,
    a bare number as much as an expression of all the numbers. Paying the nearer values more
    gives groups of legal wrong answers a direction (the countdown_gym job starved at step 19
    without it). It was not enough: a policy that drifted to bare numbers ("20", "23"), all
    worth 0.05, starved again at step 15 with every group scored alike. ``partial`` grades the
    way from a bare number to a legal expression (a legal one always earns at least
    ``partial``, more than any illegal one). Then, at ``partial`` 0.3, a policy settled on
    "a * b + c" for every puzzle (legal, 0.3, and now and then exact): with the linear falloff
    every far miss earns the same, so "a + b + c", 25 off, earned no more than "a * b + c", 200
    off; ``inverse`` ranks them."""
    if scale <= 0:
        raise ValueError(f"countdown_close: scale must be > 0, got {scale}")
    if not 0 <= partial < 1:
        raise ValueError(f"countdown_close: partial must be in [0, 1), got {partial}")
    if falloff not in _FALLOFFS:
        raise ValueError(
            f"countdown_close: falloff must be one of {sorted(_FALLOFFS)}, got {falloff!r}"
        )
    puzzle = _countdown_puzzle(sample)
    if puzzle is None:
        return 0.0
    target, given, exactly = puzzle
    text = sample.response_text
    answer = (
        gym_task.response_answer(text, "first_line", strip_equation=True)
        if exactly
        else countdown_task.answer_line(text)
    )
    tree = expression.parse(answer)
    if tree is None:
        return 0.0
    used = sorted(expression.numbers(tree))
    legal = used == sorted(given) if exactly else not Counter(used) - Counter(given)
    result = expression.value(tree)
    if not legal or result is None:
        if not given:
            return 0.0
        matched = sum((Counter(used) & Counter(given)).values())
        return partial * max(0, matched - (len(used) - matched)) / len(given)
    return partial + (1 - partial) * _FALLOFFS[falloff](abs(float(result) - target), scale)


# Closeness of a legal countdown miss: (distance to the target, scale) -> [0, 1].
_FALLOFFS: dict[str, Callable[[float, float], float]] = {
    "linear": lambda distance, scale: max(0.0, 1.0 - distance / scale),
    "inverse": lambda distance, scale: scale / (scale + distance),
}


def _countdown_puzzle(sample: RewardInput) -> tuple[int, list[int], bool] | None:
    """(target, numbers, all must be used) of a reasoning-gym countdown prompt (its entry) or
    of the built-in task's (its JSON ground truth); None for anything else."""
    entry = (sample.metadata or {}).get("entry") if sample.metadata else None
    if isinstance(entry, dict) and isinstance(entry.get("metadata"), dict):
        meta = entry["metadata"]
        if "target" in meta and "numbers" in meta:
            return int(meta["target"]), [int(n) for n in meta["numbers"]], True
    truth = countdown_task.puzzle(sample.ground_truth)
    return None if truth is None else (truth[0], truth[1], False)


@register("reasoning_gym")
def reasoning_gym(
    sample: RewardInput, *, answer: str = "last_line", strip_equation: bool = False
) -> float:
    """A reasoning-gym prompt's own verifier (``data.source: reasoning_gym:<task>``) on the
    answer the response gives (its last ``<answer>`` tag, else its last line, or its first
    with ``answer="first_line"``; ``strip_equation``: without a trailing ``= ...``;
    ``tasks.reasoning_gym.response_answer``); part credit where the task gives it; 0 for a
    prompt of another source."""
    return gym_task.score(sample.response_text, sample.metadata, answer, strip_equation)
