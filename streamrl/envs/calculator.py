"""``calculator``: arithmetic questions with a calculator tool.

The policy may answer a turn with a tool call, ``<calc>23 + 8 - 14</calc>`` (integers, ``+ - *
/`` and parentheses: ``streamrl.tasks.expression``); the environment answers
``<result>17</result>`` and the policy goes on. A turn without a tool call is the final
answer, which must be a number and nothing else: right, reward 1 and success; anything else,
0. Either way the episode ends. A malformed tool call (no closing tag, or an
expression the calculator refuses) ends the episode with reward 0 and the reason recorded.

Prompts come from a task (``data.source``, e.g. ``chain``); the config's system prompt tells
the model about the tool (configs/calculator.yaml).
"""

from __future__ import annotations

import re
from fractions import Fraction

from streamrl.envs.base import Environment, StepResult
from streamrl.tasks.base import Prompt
from streamrl.tasks.expression import parse, value

OPEN, CLOSE = "<calc>", "</calc>"
_CALL = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
# A final answer is a number and nothing else (a trailing full stop allowed): a number found
# somewhere in a sentence, or inside an imitated "<result>", is no answer.
_ANSWER = re.compile(r"([-+]?\d+(?:\.\d+)?)\.?")


def format_value(number: Fraction | None) -> str:
    """An exact result as text: an integer, else a decimal to 6 places; "undefined" for a
    division by zero."""
    if number is None:
        return "undefined"
    if number.denominator == 1:
        return str(number.numerator)
    return f"{float(number):.6g}"


INSTRUCTIONS = (
    "You have a calculator. To use it, reply with only <calc>expression</calc>, for example "
    "<calc>12 + 7 - 3</calc>, and you will get <result>16</result>. When you know the "
    "answer, reply with the number only."
)


# One worked exchange, shown before every question (``Environment.examples``).
EXAMPLE = (
    {"role": "user", "content": "What is 12 + 7 - 3?"},
    {"role": "assistant", "content": "<calc>12 + 7 - 3</calc>"},
    {"role": "user", "content": "<result>16</result>"},
    {"role": "assistant", "content": "16"},
)


class Calculator(Environment):
    def __init__(
        self, instructions: str = INSTRUCTIONS, example: bool = True, reward_correct: float = 1.0
    ) -> None:
        self.instructions, self.reward_correct = instructions, reward_correct
        self.examples = EXAMPLE if example else ()
        self.truth = ""

    def reset(self, prompt: Prompt) -> None:
        self.truth = prompt.ground_truth.strip()

    def step(self, text: str) -> StepResult:
        if OPEN in text:
            call = _CALL.search(text)
            if call is None:
                return StepResult(done=True, error="malformed tool call: no </calc>")
            tree = parse(call.group(1))
            if tree is None:
                return StepResult(done=True, error="malformed tool call: not an expression")
            return StepResult(
                observation=f"<result>{format_value(value(tree))}</result>",
                counts={"tool_calls": 1.0},
            )
        answer = _ANSWER.fullmatch(text.strip())
        right = answer is not None and _equal(answer.group(1), self.truth)
        return StepResult(reward=self.reward_correct if right else 0.0, done=True, success=right)


def _equal(answer: str, truth: str) -> bool:
    try:
        return abs(float(answer) - float(truth)) < 1e-9
    except ValueError:
        return answer == truth
