"""Command-line overrides, ``section.key=value``: each value read for the type of the key it
sets (``parse_overrides``), and argparse command lines whose overrides may follow flags
(``parse_with_overrides``, shared by ``streamrl`` and ``streamrl bench``)."""

from __future__ import annotations

import argparse
import re
import typing
from collections.abc import Sequence
from typing import Any, Literal

import msgspec
import yaml

from streamrl.config.base import ConfigError
from streamrl.config.schema import _UNKNOWN, _field_type, _members


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"config override {dotted!r}: {key!r} is not a section")
        node = child
    if keys[-1].endswith(APPEND):  # ``rewards+=[...]``: the list gains the items
        name = keys[-1].removesuffix(APPEND)
        current = node.get(name, [])
        if not isinstance(current, list) or not isinstance(value, list):
            raise ConfigError(f"config override {dotted}=...: += adds a list to a list")
        node[name] = [*current, *value]
        return
    node[keys[-1]] = value


# ``key+=[...]`` appends to the list at ``key`` (``rewards+=[{teacher: {model: runs/t}}]``).
APPEND = "+"
_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
_NULL_WORDS = frozenset({"null", "Null", "NULL", "~"})
# One override: ``"section.key=text"`` as typed, or ``(key, value)`` already a Python value.
Override = str | tuple[str, Any]


def parse_overrides(overrides: Sequence[Override]) -> list[tuple[str, Any]]:
    """``section.key=value`` overrides as ``(dotted key, value)``, each value read for the type
    of the ``Config`` field at its dotted key:

    - a ``str`` field (or a ``Literal`` of strings) takes the text as typed, never YAML:
      ``data.prompt_template=Question: {question}`` and ``data.answer_pattern=#### (.+)``
      arrive as written. One exception keeps the spelling that was needed when every value
      was YAML: text wholly in one pair of quotes, which YAML reads as one quoted string, is
      that string (``data.answer_pattern='####\\s*(.+)'``, ``eval.unseen_phrasing=""``);
    - a field of any other type (int, float, bool, list, dict, tuple, a section, a union
      without ``str``) reads the text as YAML (``3``, ``true``, ``[1, 2]``, ``{r: 8}``, ``1e-4``
      as a float); text YAML cannot read whole (an unclosed bracket, a ``#`` that would start a
      comment) is refused in one line, with a hint to quote;
    - a union with ``str`` (``str | None``, ``list[str] | str``) and a value of any type (the
      keys under ``data.args``) take the text as a ``str`` field does, unless YAML reads all
      of it as a value of one of the other types: ``null``/``~`` for ``None``, a number, a
      boolean, or a bracketed ``[...]``/``{...}`` collection (``Question: {question}`` is a
      string, not a mapping);
    - a key the schema does not have is read as a value of any type (the config then moves
      it, when it moved, or refuses it by name);
    - ``key+=[...]`` (a list field) appends its items to the list the config has: the pair's
      key keeps the ``+`` (``("rewards+", [...])``) for ``load_config`` to append.

    A ``(key, value)`` pair is taken as it is (``streamrl.train`` passes Python values).

    Example: ``["learner.lr=1e-4", "data.answer_pattern=#### (.+)", "model.revision=null"]``
    -> ``[("learner.lr", 0.0001), ("data.answer_pattern", "#### (.+)"),
    ("model.revision", None)]``.
    """
    parsed = []
    for item in overrides:
        if isinstance(item, tuple):
            key, value = item
            _check_override_key(key, f"{key}=...")
            parsed.append((key, value))
            continue
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"bad override {item!r}: expected section.key=value")
        _check_override_key(key, item)
        parsed.append((key, _override_value(item, key, raw)))
    return parsed


def _check_override_key(key: str, item: str) -> None:
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"bad override {item!r}: expected section.key=value")


def _override_value(item: str, key: str, raw: str) -> Any:
    """``raw`` read for the field at ``key`` (``parse_overrides``' rule)."""
    kind = _field_type(key.removesuffix(APPEND))
    if kind is _UNKNOWN:  # refused by name later; an old key's text keeps its meaning
        kind = Any
    members = () if kind is Any else _members(kind)
    if kind is Any or any(_is_text(member) for member in members):
        quoted = _quoted(raw)
        if quoted is not None or raw == "" or _is_text(kind):
            return raw if quoted is None else quoted
        others = tuple(member for member in members if not _is_text(member))
        try:
            value, whole = _read_yaml(raw)
        except yaml.YAMLError:
            return raw
        fits = whole and not isinstance(value, str) and _fits(value, raw, others, kind is Any)
        return value if fits else raw
    quote = "put text holding ': ' or ' #' in quotes: ['a: b']"
    try:
        value, whole = _read_yaml(raw)
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0]
        raise ConfigError(f"bad override {item!r}: {key} takes YAML: {first} ({quote})") from None
    if not whole:
        raise ConfigError(
            f"bad override {item!r}: {key} takes YAML, where ' #' starts a comment ({quote})"
        )
    return value


def _quoted(raw: str) -> str | None:
    """The string that ``raw`` quotes when it is wholly one YAML quoted string (``'a: b'``,
    ``"x\\ny"``, ``''``): the spelling overrides needed when every value was read as YAML, so
    it keeps its meaning. None for any other text (``'a' or 'b'`` included)."""
    text = raw.strip()
    if len(text) < 2 or text[0] not in "'\"" or text[-1] != text[0]:
        return None
    try:
        node = yaml.compose(text)
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    whole = node is not None and node.end_mark.index == len(text)
    return value if whole and isinstance(value, str) else None


def _read_yaml(raw: str) -> tuple[Any, bool]:
    """The YAML value of ``raw`` and whether YAML read all of it (no comment dropped)."""
    node = yaml.compose(raw)
    whole = node is not None and node.end_mark.index >= len(raw.rstrip())
    value = yaml.safe_load(raw)
    if isinstance(value, str) and _FLOAT.fullmatch(value):
        value = float(value)  # YAML 1.1 reads `1e-4` (no dot) as a string
    return value, whole


def _fits(value: Any, raw: str, others: tuple[Any, ...], anything: bool) -> bool:
    """A YAML-read ``value`` is taken over the text: it is one of ``others`` (or anything), a
    ``None`` spelled as a null word, a collection written in brackets."""
    text = raw.strip()
    if value is None and text not in _NULL_WORDS:
        return False
    if isinstance(value, list | dict) and not text.startswith(("[", "{")):
        return False  # `Question: {question}` is text, not a block mapping
    if anything:
        return True
    try:
        msgspec.convert(value, typing.Union[others])  # noqa: UP007 (a runtime tuple)
    except msgspec.ValidationError:
        return False
    return True


def _is_text(kind: Any) -> bool:
    """``str``, or a ``Literal`` of strings: a field whose values are text."""
    if kind is str:
        return True
    return typing.get_origin(kind) is Literal and all(
        isinstance(value, str) for value in typing.get_args(kind)
    )


def parse_with_overrides(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args``, where argparse would stop at overrides after a flag: every
    `key=value` it leaves behind joins ``overrides``; anything else is refused as argparse
    refuses an unknown argument (one line, exit 2)."""
    args, extra = parser.parse_known_args(argv)
    stray = [a for a in extra if a.startswith("-") or "=" not in a]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args
