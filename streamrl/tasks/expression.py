"""Arithmetic expressions read safely: integers, binary ``+ - * /`` and parentheses, nothing
else, valued exactly (``Fraction``). Never ``eval``: the text is checked against a small
alphabet, parsed by ``ast`` and walked; any other node (``**``, ``//``, a unary minus, a
name, a call, a float, ``True``) refuses the whole expression.

Example: ``value(parse("(25 - 3) * 2"))`` is ``Fraction(44)``; ``parse("2**99999")`` and
``parse("__import__('os')")`` are None; ``value(parse("1 / (2 - 2)"))`` is None.
"""

from __future__ import annotations

import ast
import operator
import re
from fractions import Fraction

# Longer answers are refused unread: no legitimate expression of a few numbers is this long,
# and it bounds the parser's work and the values' size.
MAX_CHARS = 120
_ALPHABET = re.compile(r"[0-9+\-*/() \t]+")
_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _allowed(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return type(node.value) is int  # not bool, float or complex
    if isinstance(node, ast.BinOp):
        return type(node.op) in _OPERATORS and _allowed(node.left) and _allowed(node.right)
    return False


def parse(text: str) -> ast.expr | None:
    """The expression tree of ``text``, or None if it is anything but integers, binary
    ``+ - * /`` and parentheses (module doc)."""
    text = text.strip()
    if not text or len(text) > MAX_CHARS or not _ALPHABET.fullmatch(text):
        return None
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return tree if _allowed(tree) else None


def numbers(tree: ast.expr) -> list[int]:
    """The integer literals of a parsed expression, left to right."""
    if isinstance(tree, ast.BinOp):
        return numbers(tree.left) + numbers(tree.right)
    return [tree.value] if isinstance(tree, ast.Constant) else []


def value(tree: ast.expr) -> Fraction | None:
    """The exact value of a parsed expression; None on a division by zero."""
    if isinstance(tree, ast.Constant):
        return Fraction(tree.value)
    if not isinstance(tree, ast.BinOp):
        return None
    left, right = value(tree.left), value(tree.right)
    if left is None or right is None or (isinstance(tree.op, ast.Div) and right == 0):
        return None
    return _OPERATORS[type(tree.op)](left, right)
