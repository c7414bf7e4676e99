"""``streamrl.rewards.math_answers``: math-verify behind the math rewards, on and off the main
thread."""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from streamrl.config import ConfigError, RewardSpec
from streamrl.rewards import CombinedReward, RewardInput, check_rewards, resolve_reward
from streamrl.rewards.math_answers import (
    boxed_answer,
    gsm8k_answer,
    math_equal,
    math_exact,
    require_math_verify,
)

needs_math_verify = pytest.mark.skipif(
    importlib.util.find_spec("math_verify") is None, reason="math-verify is not installed"
)

# (answer, ground truth, equal)
PAIRS = [
    ("0.5", r"\frac{1}{2}", True),
    (r"\frac12", "0.5", True),
    (r"\frac{1}{2}", "1/2", True),
    (r"\dfrac{3}{4}", "0.75", True),
    ("2/4", "1/2", True),
    (r"\sqrt{2}/2", r"\frac{\sqrt2}{2}", True),
    ("1,000", "1000", True),
    ("10,000,000", "10000000", True),
    ("42.0", "42", True),
    ("-3", "-3", True),
    ("x^2+1", "1+x^2", True),
    ("x = 3", "3", True),
    (r"\$5", "5", True),
    (r"5 \text{ cm}", "5", True),
    ("(1,2]", "(1, 2]", True),
    (r"\{1,2\}", r"\{2,1\}", True),
    (r"\infty", r"\infty", True),
    (r"$\frac{1}{2}$", r"\frac12", True),
    ("3", "4", False),
    ("0.1234567", "0.1234568", False),  # two plain numbers compare exactly
    ("123456789012345678", "123456789012345679", False),
    (r"\frac{1}{3}", "0.3", False),
    ("x^2+1", "x^2-1", False),
    ("(1,2)", "[1,2]", False),
    ("1,00", "100", False),  # not a number with thousands: a set
    ("garbage", "42", False),
    ("", "42", False),
    ("42", "", False),
    ("", "", False),
    (r"\frac{1}{", "0.5", False),
]


def _off_main_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` run on a worker thread (as a generator's reward call is); what it returned,
    or what it raised, re-raised here."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 (re-raised on the test's thread)
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "still running after 60 s"
    if "error" in result:
        raise result["error"]
    return result["value"]


@needs_math_verify
@pytest.mark.parametrize(("answer", "truth", "equal"), PAIRS)
def test_math_equal_on_the_main_thread(answer: str, truth: str, equal: bool) -> None:
    assert math_equal(answer, truth) is equal


@needs_math_verify
@pytest.mark.parametrize(("answer", "truth", "equal"), PAIRS)
def test_math_equal_off_the_main_thread_never_raises(answer: str, truth: str, equal: bool) -> None:
    """math-verify's own alarms raise ``ValueError`` off the main thread; ``math_equal``
    passes no timeout there and answers the same."""
    assert _off_main_thread(lambda: math_equal(answer, truth)) is equal


@needs_math_verify
@pytest.mark.parametrize(
    "answer",
    [r"10!!!", r"10^{10^{10}}", r"9^{9^{9^{9}}}", r"2^{2^{30}}", r"(x+1)^{1000}", r"(10^{10})!"],
)
def test_blowups_are_screened_off_the_main_thread(answer: str) -> None:
    """Unscreened, each of these ran past 60 s (``10!!!`` also took 9 GB) or for seconds with
    no timeout, which is what a worker thread gets; screened, it is unequal at once."""
    start = time.monotonic()
    assert _off_main_thread(lambda: math_equal(answer, "1")) is False
    assert _off_main_thread(lambda: math_exact(f"so $${answer}$$", "1")) is False
    assert math_equal(answer, answer)  # the same text is still the same answer
    assert time.monotonic() - start < 20


@needs_math_verify
def test_large_but_tame_values_still_compare() -> None:
    assert math_equal(r"2^{10}", "1024")
    assert math_equal("5!", "120")
    assert math_equal(r"\binom{6}{2}", "15")
    assert not math_equal(r"2^{1000}", r"2^{1001}")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (
            r"\boxed{\frac{\sqrt{3}}{2}} then \boxed{\left\{1, {2}\right\}}",
            r"\left\{1, {2}\right\}",
        ),
        (r"\boxed{}", ""),
        (r"\boxed{\frac{1}{2}", None),  # unclosed
        ("no box", None),
        ("", None),
    ],
)
def test_boxed_answer_is_the_last_box_with_nested_braces(text: str, expected: str | None) -> None:
    assert boxed_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so\n#### 72", "72"),
        ("####1,000.", "1,000"),
        ("#### -3.5", "-3.5"),
        ("#### 8\n#### 9", "8"),  # the first, as the gsm task's exact check reads
        ("#### eight", None),
        ("72", None),
    ],
)
def test_gsm8k_answer(text: str, expected: str | None) -> None:
    assert gsm8k_answer(text) == expected


@needs_math_verify
@pytest.mark.parametrize(
    ("response", "truth", "exact"),
    [
        (r"Half of it: $\boxed{\frac{1}{2}}$", "0.5", True),
        (r"\boxed{0.5}", r"\boxed{\frac12}", True),
        (r"first \boxed{3}, no: \boxed{4}", "4", True),
        (r"first \boxed{4}, no: \boxed{3}", "4", False),
        (r"The final answer is $\frac{1}{2}$.", "1/2", True),  # no box: math-verify extracts
        ("The answer is 7.", "8", False),
        ("", "8", False),
        (r"\boxed{8}", "", False),
    ],
)
def test_math_exact(response: str, truth: str, exact: bool) -> None:
    assert math_exact(response, truth) is exact
    assert _off_main_thread(lambda: math_exact(response, truth)) is exact


@needs_math_verify
@pytest.mark.parametrize(
    ("name", "text", "truth", "args", "expected"),
    [
        ("boxed_math", r"so \boxed{0.5}", r"\frac12", {}, 1.0),
        ("boxed_math", r"so \boxed{\frac{2}{4}}", r"the answer is \boxed{0.5}", {}, 1.0),
        ("boxed_math", r"\boxed{x^2+1}", "1+x^2", {}, 1.0),
        ("boxed_math", r"\boxed{3}", r"\frac12", {}, 0.0),
        ("boxed_math", "0.5", "0.5", {}, 0.0),  # no box
        ("gsm8k", "so\n#### 1,000", "1000", {}, 1.0),
        ("gsm8k", "so\n#### 1000.", "work\n#### 1,000", {}, 1.0),
        ("gsm8k", "#### 999", "1000", {"format_score": 0.1}, 0.1),
        ("gsm8k", "#### 1,00", "100", {"format_score": 0.1}, 0.1),
        ("gsm8k", "1000", "1000", {"format_score": 0.1}, 0.0),  # no ####
    ],
)
def test_math_rewards(
    name: str, text: str, truth: str, args: dict[str, Any], expected: float
) -> None:
    sample = RewardInput(text, [1], truth, finish_reason="stop")
    assert resolve_reward(name)(sample, **args) == expected
    assert _off_main_thread(lambda: resolve_reward(name)(sample, **args)) == expected
    combined = CombinedReward([RewardSpec(name=name, args=args)])
    assert _off_main_thread(lambda: combined(sample)) == expected
    assert combined.errors == 0


def test_a_missing_math_verify_fails_when_the_config_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import math_verify -> ImportError
    message = "the reward 'boxed_math' needs math-verify: pip install 'streamrl[math]'"
    with pytest.raises(ConfigError) as caught:
        require_math_verify()
    assert str(caught.value) == message
    with pytest.raises(ConfigError, match="^the reward 'boxed_math' needs math-verify"):
        check_rewards([RewardSpec(name="boxed_math")])
    with pytest.raises(ConfigError, match="^the reward 'gsm8k' needs math-verify"):
        check_rewards([RewardSpec(name="gsm8k", args={"format_score": 0.1})])
    with pytest.raises(ConfigError, match="^the reward 'gsm8k' needs math-verify"):
        check_rewards([RewardSpec(name="stopped", args={"after": "gsm8k"})])
    check_rewards([RewardSpec(name="numeric_match")])  # the others do not need it
    # Called anyway, the comparison never raises: plain numbers still compare, LaTeX cannot.
    assert math_equal("1,000", "1000")
    assert not math_equal("0.5", r"\frac12")
    assert not math_exact("The answer is $0.5$", "0.5")


@needs_math_verify
def test_check_rewards_passes_with_math_verify() -> None:
    check_rewards([RewardSpec(name="boxed_math"), RewardSpec(name="gsm8k")])
