"""Math answers: find a response's final answer and decide whether it equals the ground truth.

Why: comparing answer texts fails on equal values written differently (``0.5`` and
``\\frac12``, ``x^2+1`` and ``1+x^2``, ``\\{1,2\\}`` and ``\\{2,1\\}``). Hugging Face's
``math-verify`` (the extra ``pip install 'streamrl[math]'``; ``require_math_verify`` says so
when it is missing) parses both sides to sympy and compares them, as verl and TRL do. It is
imported only when a comparison needs it. Two plain numbers are compared here first, exactly
(``1,000`` is ``1000``; ``0.1234567`` is not ``0.1234568``, though math-verify rounds floats
to 6 places and would say so).

Threads: math-verify bounds its parsing and comparison with ``signal.alarm``, which only the
main thread may set; on another thread (a generator scores in a Ray actor's worker thread) it
raises ``ValueError`` unless ``parsing_timeout``/``timeout_seconds`` are ``None``, and then
nothing bounds sympy: comparing ``10!!!`` ran past 60 s and 9 GB, ``10^{10^{10}}`` past 60 s,
in bigint code that a watchdog thread cannot interrupt either. So the main thread keeps the
alarms (``TIMEOUT_S``), other threads pass ``None``, and on every thread parsed values that
would make sympy build a number of over ``MAX_DIGITS`` digits or expand a power of a variable
over ``MAX_DEGREE`` are dropped before the comparison (``_tame``; parsing leaves them
unevaluated and is fast). That screens the known blow-ups; it does not prove a time bound.
Nothing here raises: a failure compares unequal.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from fractions import Fraction
from typing import Any

from streamrl.config import ConfigError

log = logging.getLogger(__name__)

TIMEOUT_S = 5  # math-verify's alarm for each parse and comparison (main thread only)
MAX_DIGITS = 100_000  # the largest number a comparison may make sympy build
MAX_CHARS = 1_000  # a longer extracted answer (or ground truth) compares as text only
MAX_DEGREE = 200  # the largest power of a variable a comparison may expand

# A plain number (as ``rewards`` reads one): "-7", "+42", "1,024", "2.5"; not "1,00".
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")
# GSM8K's final answer: the number after the first "####" (``rewards.gsm8k``, ``tasks.gsm``).
_GSM8K = re.compile(r"####\s*(-?[\d,\.]+)")
_BOXED = "\\boxed{"
_missing_logged = False


def boxed_answer(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (nested braces kept), else None
    (none, or one left unclosed)."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, i = 0, start + len(_BOXED)
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            if depth == 0:
                return text[i:j]
            depth -= 1
    return None


def gsm8k_answer(text: str) -> str | None:
    """The number after the first ``####`` (digits, commas and dots, an optional ``-``; a
    trailing ``.`` dropped: ``"#### 1,000."`` -> ``"1,000"``), else None."""
    match = _GSM8K.search(text)
    return match.group(1).rstrip(".") if match else None


def require_math_verify(user: str = "the reward 'boxed_math'") -> None:
    """Raise ``ConfigError`` (one line, naming ``user``) if math-verify cannot be imported."""
    try:
        import math_verify  # noqa: F401
    except ImportError:
        raise ConfigError(f"{user} needs math-verify: pip install 'streamrl[math]'") from None


def math_equal(answer: str, ground_truth: str) -> bool:
    """Whether ``answer`` (a final answer already extracted: ``"\\frac{1}{2}"``, ``"0.5"``,
    ``"x^2+1"``) equals ``ground_truth`` mathematically (module doc). Never raises."""
    try:
        return _equal(answer, ground_truth)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # math-verify's TimeoutException is a BaseException
        log.debug("math_equal(%.80r, %.80r) failed; unequal", answer, ground_truth, exc_info=True)
        return False


def math_exact(response: str, ground_truth: str) -> bool:
    """The held-out exact check for a MATH-style prompt: the response's last ``\\boxed{}``
    answer equals the ground truth (itself boxed or bare); with no box, math-verify's own
    extraction from the whole response (its LaTeX and expression targets) decides."""
    truth = boxed_answer(ground_truth) or ground_truth
    answer = boxed_answer(response)
    if answer is not None:
        return math_equal(answer, truth)
    try:
        mv = _math_verify()
        if mv is None or not truth.strip() or len(truth) > MAX_CHARS:
            return False
        targets = [mv.LatexExtractionConfig(), mv.ExprExtractionConfig()]
        extracted = mv.parse(response, extraction_config=targets, parsing_timeout=_timeout())
        return _verify(mv, truth, extracted)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:
        log.debug("math_exact failed; not exact", exc_info=True)
        return False


def _equal(answer: str, truth: str) -> bool:
    answer, truth = answer.strip(), truth.strip()
    if not answer or not truth:
        return False
    if "".join(answer.split()) == "".join(truth.split()):
        return True
    a, b = _NUMBER.fullmatch(answer), _NUMBER.fullmatch(truth)
    if a and b:
        return Fraction(a.group().replace(",", "")) == Fraction(b.group().replace(",", ""))
    mv = _math_verify()
    if mv is None or len(answer) > MAX_CHARS or len(truth) > MAX_CHARS:
        return False
    return _verify(mv, truth, _parse(mv, answer))


def _verify(mv: Any, truth: str, extracted: list[Any]) -> bool:
    """math-verify's verdict on parsed answers against the bare ``truth`` (parsed as
    verl/TRL parse gold: boxed, LaTeX and expression targets), the screened values dropped."""
    gold = [g for g in _parse(mv, truth) if _tame(g)]
    answers = [a for a in extracted if _tame(a)]
    return bool(gold and answers and mv.verify(gold, answers, timeout_seconds=_timeout()))


def _parse(mv: Any, answer: str) -> list[Any]:
    """A bare answer parsed as math-verify reads a boxed one (unboxed, ``\\frac12`` and
    ``x^2+1`` are not found); ``$...$`` around it is dropped."""
    answer = answer.strip().removeprefix("$").removesuffix("$")
    targets = [mv.LatexExtractionConfig(), mv.ExprExtractionConfig()]
    return list(mv.parse(_BOXED + answer + "}", targets, parsing_timeout=_timeout()))


def _timeout() -> int | None:
    """math-verify's alarms where they work (the main thread), else none (module doc)."""
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _math_verify() -> Any:
    """The math_verify module, or None (logged once) when it is not installed."""
    global _missing_logged
    try:
        import math_verify
    except ImportError:
        if not _missing_logged:
            _missing_logged = True
            log.error(
                "math-verify is not installed (pip install 'streamrl[math]'): math "
                "answers that differ as text compare unequal"
            )
        return None
    return math_verify


def _tame(value: Any, power: float = 1.0) -> bool:
    """Whether sympy can evaluate ``value`` raised to ``power`` without building a number of
    over ``MAX_DIGITS`` digits (integers and fractions by their digits, powers by their
    exponent's size, factorials and their kin by their argument) or a polynomial of degree
    over ``MAX_DEGREE`` (``(x+1)^{1000}`` against ``1`` took 4 s) (module doc)."""
    import sympy

    if isinstance(value, str):
        return True  # compared as text
    if isinstance(value, sympy.MatrixBase) and not isinstance(value, sympy.Basic):
        return all(_tame(entry, power) for entry in value)
    if not isinstance(value, sympy.Basic):
        return False
    if isinstance(value, sympy.Rational):  # Integer too
        bits = max(abs(value.p).bit_length() - 1, 0) + max(value.q.bit_length() - 1, 0)
        return bits * math.log10(2) * power <= MAX_DIGITS
    if isinstance(value, sympy.Symbol):
        return power <= MAX_DEGREE
    if isinstance(value, sympy.Pow):
        base, exponent = value.args
        if not _tame(exponent):  # first: its size is computed next
            return False
        size = 1.0 if exponent.free_symbols else _size(exponent)
        return _tame(base, power * max(size, 1.0))
    if isinstance(value, _factorial_like()):
        for arg in value.args:
            if not _tame(arg):
                return False
            n = 0.0 if arg.free_symbols else _size(arg)
            if not n * math.log10(n + 2) * power <= MAX_DIGITS:  # nan (n inf) is too big
                return False
        return True
    return all(_tame(arg, power) for arg in value.args)


def _size(value: Any) -> float:
    """``|value|`` of a tame expression without symbols, ``inf`` if it has none."""
    try:
        return abs(complex(value))
    except (TypeError, ValueError, OverflowError):
        return math.inf


def _factorial_like() -> tuple[type, ...]:
    import sympy

    return (
        sympy.factorial,
        sympy.factorial2,
        sympy.subfactorial,
        sympy.binomial,
        sympy.gamma,
        sympy.RisingFactorial,
        sympy.FallingFactorial,
    )
