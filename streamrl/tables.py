"""A user's rows as prompts: files, saved datasets and hub datasets, through one mapping.

``open_table(source, data, split)`` reads any table source with Hugging Face ``datasets``,
so every kind stays memory-mapped Arrow (never a Python list of rows):

- a ``.jsonl``/``.json``, ``.parquet`` or ``.csv`` file (``load_dataset(<builder>,
  data_files=...)``, converted to Arrow once in the datasets cache);
- a directory written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``
  (``load_from_disk``; a DatasetDict's ``split``);
- a hub dataset, ``owner/name`` or ``hf:name`` (``load_dataset(name, data.subset,
  split=..., revision=data.revision)``: downloaded when the hub is reachable, honouring
  ``HF_ENDPOINT``, ``HF_HOME``, ``HF_TOKEN`` and ``HF_HUB_OFFLINE``; from the local cache
  otherwise).

A file and a saved ``Dataset`` are one table, split ``train`` (``TABLE_SPLIT``): any other split
asked of them is refused, never read as the same rows (held-out rows of their own are a file
of their own, named by ``eval.source``).

``RowMapping`` turns a row into a ``Prompt`` by ``data``'s keys: the prompt at
``prompt_key`` (messages or a string) or ``prompt_template`` over the row's fields, an
optional ``system_prompt``, the ground truth at ``answer_key`` through ``answer_pattern``.
The default mapping is verl's layout (``prompt``; ``reward_model.ground_truth`` or
``ground_truth``; ``data_source``). ``split_rows`` maps every row once (the controller does it
before any role starts), so a missing column, a template field the rows lack or an answer
pattern that matches few rows fails in one line (``DataError``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from streamrl.config import DataConfig
from streamrl.tasks.base import DataError, Prompt, held_out

log = logging.getLogger(__name__)

FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
HUB_PREFIX = "hf:"
# The one split of a file or a saved Dataset (the name ``datasets`` gives it).
TABLE_SPLIT = "train"
VERL_ANSWER_KEYS = ("reward_model.ground_truth", "ground_truth")  # data.answer_key ""
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
# An answer pattern that fails on more than this share of the rows is refused: the mapping is
# wrong, not a few rows.
MAX_UNMATCHED_SHARE = 0.5


def table_kind(source: str) -> str:
    """``file``, ``saved`` (a save_to_disk directory) or ``hub``; ``DataError`` if none."""
    path = Path(source).expanduser()
    if source.startswith(HUB_PREFIX):
        return "hub"
    if path.suffix.lower() in FILE_BUILDERS:
        if not path.is_file():
            raise DataError(f"prompt file not found: {source}")
        return "file"
    if path.is_dir():
        if any((path / name).is_file() for name in _SAVED_MARKERS):
            return "saved"
        raise DataError(
            f"{source}: a directory but not one written by Dataset.save_to_disk (no "
            "dataset_info.json, state.json or dataset_dict.json)"
        )
    if path.suffix:
        raise DataError(f"{source}: unsupported prompt file type (use {', '.join(FILE_BUILDERS)})")
    if _HUB_ID.fullmatch(source):
        return "hub"
    from streamrl.tasks import TASKS  # below the tasks, which import nothing of this

    raise DataError(
        f"data.source {source!r} is not a built-in task ({', '.join(TASKS)}), "
        "reasoning_gym:<task>, a file, a saved dataset directory or a hub dataset "
        "(owner/name or hf:name)"
    )


_SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


def _root(exc: BaseException) -> BaseException:
    """The innermost cause: datasets wraps a parse error in "An error occurred while
    generating the dataset"."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__
    return exc


def _raise_bad_json_line(path: Path) -> None:
    """``DataError`` naming the first line of a JSON Lines file that is not JSON (the Arrow
    reader's error names a block, not a line); returns if every line parses."""
    with path.open() as lines:
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _one_split(source: str, what: str, split: str) -> None:
    """``DataError`` unless ``split`` is the one split of a one-table source (module doc):
    reading it as another would make "held-out" the training rows."""
    if split != TABLE_SPLIT:
        raise DataError(
            f"{source}: a {what} has one split, {TABLE_SPLIT!r}, not {split!r} (held-out "
            "rows of their own: a file named by eval.source, data.eval_split empty; or leave "
            "data.eval_split empty to hold out one row in data.holdout_every)"
        )


def open_table(source: str, data: DataConfig, split: str) -> Any:
    """The ``datasets.Dataset`` of ``source``'s ``split`` (module doc), its first
    ``data.max_rows`` rows when set; ``DataError`` in one line, also for a split other than
    ``train`` of a file or a saved ``Dataset`` (one table each).

    Example: ``open_table("gsm.jsonl", data, "test")`` raises (a file has one split);
    ``open_table("gsm.jsonl", data, "train")`` is every row of it."""
    import datasets

    datasets.disable_progress_bars()
    # Its readers log a failure before raising it; the one-line DataError below says it.
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    kind = table_kind(source)
    try:
        if kind == "file":
            _one_split(source, "file", split)
            if Path(source).expanduser().stat().st_size == 0:
                raise DataError(f"data.source {source}: the file is empty: no rows")
            builder = FILE_BUILDERS[Path(source).suffix.lower()]
            table = datasets.load_dataset(
                builder, data_files=str(Path(source).expanduser()), split=TABLE_SPLIT
            )
        elif kind == "saved":
            table = datasets.load_from_disk(str(Path(source).expanduser()))
            if isinstance(table, datasets.DatasetDict):
                if split not in table:
                    raise DataError(f"{source}: no split {split!r} (splits: {', '.join(table)})")
                table = table[split]
            else:
                _one_split(source, "saved Dataset (not a DatasetDict)", split)
        else:
            table = datasets.load_dataset(
                source.removeprefix(HUB_PREFIX),
                data.subset or None,
                split=split,
                revision=data.revision or None,
            )
    except DataError:
        raise
    except Exception as exc:  # datasets and the hub raise many types; the user needs a line
        if kind == "file" and FILE_BUILDERS[Path(source).suffix.lower()] == "json":
            _raise_bad_json_line(Path(source).expanduser())
        hint = ""
        if kind == "hub":
            hint = (
                " (a hub dataset downloads when the hub is reachable, with HF_TOKEN for a "
                "gated one; offline it is read from the cache of an earlier download, "
                "HF_HUB_OFFLINE=1)"
            )
        raise DataError(f"data.source {source}: {_first_line(_root(exc))}{hint}") from None
    if data.max_rows:
        table = table.select(range(min(data.max_rows, len(table))))
    if len(table) == 0:
        raise DataError(f"data.source {source}: split {split!r} has no rows")
    return table


def _dotted(row: dict[str, Any], path: str) -> Any:
    """``row["a"]["b"]`` for ``"a.b"``; KeyError if any step is missing."""
    node: Any = row
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(path)
        node = node[part]
    return node


@dataclass(frozen=True)
class RowMapping:
    """How a row of ``source`` becomes a ``Prompt`` (module doc)."""

    source: str
    # Prompt ids of rows without an ``id`` column: ``<name>-<row>`` (a file's stem, else the
    # source as given), worked out once rather than per prompt.
    name: str
    prompt_key: str
    prompt_template: str
    system_prompt: str
    answer_key: str
    answer_pattern: re.Pattern[str] | None
    reference_key: str = ""

    @classmethod
    def of(cls, data: DataConfig, source: str) -> RowMapping:
        try:
            pattern = re.compile(data.answer_pattern) if data.answer_pattern else None
        except re.error as exc:
            raise DataError(f"data.answer_pattern does not compile: {exc}") from None
        kind = table_kind(source)
        return cls(
            source,
            Path(source).stem if kind in ("file", "saved") else source,
            data.prompt_key,
            data.prompt_template,
            data.system_prompt or "",
            data.answer_key,
            pattern,
            data.reference_key,
        )

    def messages(self, row: dict[str, Any], index: int) -> list[dict[str, str]]:
        if self.prompt_template:
            try:
                user = self.prompt_template.format(**row)
            except (KeyError, IndexError) as exc:
                raise DataError(
                    f"row {index}: data.prompt_template names {exc} but the row has only "
                    f"{', '.join(row)}"
                ) from None
            messages = [{"role": "user", "content": user}]
        else:
            try:
                raw = _dotted(row, self.prompt_key)
            except KeyError:
                raise DataError(
                    f"row {index}: no column {self.prompt_key!r} for data.prompt_key "
                    f"(columns: {', '.join(row)})"
                ) from None
            if isinstance(raw, str):
                messages = [{"role": "user", "content": raw}]
            elif (
                isinstance(raw, list)
                and raw
                and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in raw)
            ):
                messages = [{"role": m.get("role") or "user", "content": m["content"]} for m in raw]
            else:
                raise DataError(
                    f"row {index}: {self.prompt_key!r} must be a string or a list of chat "
                    f"messages, not {type(raw).__name__}"
                )
        if self.system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def answer(self, row: dict[str, Any], index: int) -> str | None:
        """The row's ground truth; None when ``answer_pattern`` does not match it."""
        paths = [self.answer_key] if self.answer_key else list(VERL_ANSWER_KEYS)
        for path in paths:
            try:
                value = _dotted(row, path)
            except KeyError:
                continue
            if value is not None:
                break
        else:
            raise DataError(
                f"row {index}: no ground truth at {' or '.join(paths)} (data.answer_key; "
                f"columns: {', '.join(row)})"
            )
        text = value if isinstance(value, str) else json.dumps(value)
        if self.answer_pattern is None:
            return text
        match = self.answer_pattern.search(text)
        if match is None:
            return None
        return (match.group(1) if match.groups() else match.group()).strip()

    def prompt(self, row: dict[str, Any], index: int) -> Prompt:
        """Row ``index`` as a prompt (``DataError`` for a row the mapping cannot read; an
        unmatched answer pattern gives ground truth "", counted by ``split_rows``)."""
        messages = self.messages(row, index)
        truth = self.answer(row, index)
        return Prompt(
            prompt_id=str(row.get("id", f"{self.name}-{index}")),
            messages=messages,
            ground_truth="" if truth is None else truth,
            data_source=str(row.get("data_source") or self.source.removeprefix(HUB_PREFIX)),
            key=question_key(messages),
            metadata=row,
            reference=self.reference(row, index),
        )

    def reference(self, row: dict[str, Any], index: int) -> str:
        """The row's reference response at ``reference_key`` ("" without one)."""
        if not self.reference_key:
            return ""
        try:
            value = _dotted(row, self.reference_key)
        except KeyError:
            raise DataError(
                f"row {index}: no reference response at {self.reference_key!r} "
                f"(data.reference_key; columns: {', '.join(row)})"
            ) from None
        return "" if value is None else str(value)


def question_key(messages: list[dict[str, str]]) -> str:
    """What makes two rows the same question: their messages (the held-out split is chosen by
    its hash, so a duplicated row never sits on both sides)."""
    return json.dumps(messages, sort_keys=True, ensure_ascii=False)


def key_hash(key: str) -> int:
    """A question key (``question_key``) as 64 bits: what ``check_data`` compares the two sides
    by, and holds per row (8 bytes, not the key)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


@dataclass(frozen=True)
class RowSplit:
    """A table's rows by side (``split_rows``): row numbers trained on and held out, every
    row's question as ``key_hash`` (skipped rows too; index by row number), and a digest of
    the training side (each trained row's number, question and answer, in row order): the
    same rows mapped the same way give the same digest, what a resumed run is pinned to."""

    train: np.ndarray
    held: np.ndarray
    keys: np.ndarray
    digest: str


def split_rows(table: Any, mapping: RowMapping, every: int) -> RowSplit:
    """The rows of ``table`` by side: held out, those whose prompt's key hashes into one in
    ``every`` (0: none). One pass over the rows, mapping each: ``DataError`` on the first
    the mapping cannot read, naming it; rows whose answer ``answer_pattern`` does not match
    are skipped, counted, and refused when they are more than half (the pattern is wrong)."""
    train, held, unmatched, first = [], [], 0, None
    keys = np.zeros(len(table), dtype=np.uint64)
    digest = hashlib.blake2b(digest_size=16)
    for index, row in enumerate(table):
        messages = mapping.messages(row, index)
        key = question_key(messages)
        keys[index] = key_hash(key)
        answer = mapping.answer(row, index)
        if answer is None:
            unmatched += 1
            first = index if first is None else first
            continue
        if held_out(key, every):
            held.append(index)
        else:
            train.append(index)
            digest.update(json.dumps([index, key, answer], ensure_ascii=False).encode())
    if unmatched > MAX_UNMATCHED_SHARE * len(table):
        raise DataError(
            f"{mapping.source}: data.answer_pattern {mapping.answer_pattern.pattern!r} matches "
            f"the answer of {len(table) - unmatched} of {len(table)} rows (first miss: row "
            f"{first})"
        )
    if unmatched:
        log.warning(
            "%s: data.answer_pattern matches no answer in %d of %d rows; they are skipped",
            mapping.source,
            unmatched,
            len(table),
        )
    return RowSplit(
        np.asarray(train, dtype=np.int64),
        np.asarray(held, dtype=np.int64),
        keys,
        digest.hexdigest(),
    )
