"""Prompt sources (docs/design.md §7).

A run has one prompt stream with random access: ``PromptStream(data, seed)[i]`` is prompt
``i``, the same on every machine. A generated task (``streamrl.tasks``: a built-in one or
``reasoning_gym:<name>``) draws question ``i`` from a generator seeded by ``(seed, i)``; a
table (a file, a saved dataset or a hub dataset, ``streamrl.tables``) is cycled through,
reshuffled every pass from ``(seed, pass)``, and only its row numbers are held in memory (the
rows stay memory-mapped Arrow). The controller's admission hands out indices
(``controller.admission``), so no two generators work on the same prompt however many come
and go, and a resumed run continues the stream instead of replaying it.

Held out for evaluation, never trained on: a task's questions whose key hashes into one in
``data.holdout_every`` (``tasks.base.held_out``); for a table, ``data.eval_split`` when named
(a hub dataset's or a saved DatasetDict's; a file has one split), else its rows whose prompt
hashes likewise, when evaluation reads the same table (``eval.source`` "" or the same source
by ``source_identity``: ``./f.jsonl`` is its absolute path; another eval source leaves every
row to training). Whatever the kinds, ``check_data`` refuses a table whose evaluated rows ask
a question a training row asks (``tables.question_key``) and says how many each side has.
Rows whose answer ``data.answer_pattern`` does not match are skipped, and counted.

``Prompt``, ``DataError`` and the arithmetic task's functions are defined in
``streamrl.tasks`` and re-exported here.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from streamrl.config import Config, ConfigError, DataConfig
from streamrl.tables import (
    HUB_PREFIX,
    RowMapping,
    RowSplit,
    open_table,
    split_rows,
    table_kind,
)
from streamrl.tasks import check_task_settings, task_for
from streamrl.tasks.arithmetic import arithmetic_prompts, arithmetic_question, is_held_out
from streamrl.tasks.base import DataError, Prompt

__all__ = [
    "DataError",
    "DataSides",
    "Prompt",
    "PromptStream",
    "TableRows",
    "arithmetic_prompts",
    "arithmetic_question",
    "check_data",
    "data_fingerprint",
    "evaluated_rows",
    "is_held_out",
    "prompt_source",
    "source_identity",
    "table_rows",
]

log = logging.getLogger(__name__)


class TableRows:
    """A table's rows split for training and evaluation (module doc): the Arrow table, its
    mapping, the row numbers of each side (numpy, not the rows), every row's question as 64
    bits (``keys``, by row number) and the training side's ``digest`` (``tables.RowSplit``)."""

    def __init__(self, table: Any, mapping: RowMapping, rows: RowSplit) -> None:
        self.table, self.mapping = table, mapping
        self.train_rows, self.eval_rows = rows.train, rows.held
        self.keys, self.digest = rows.keys, rows.digest

    def prompt(self, row: int) -> Prompt:
        return self.mapping.prompt(self.table[int(row)], int(row))


@functools.lru_cache(maxsize=8)
def _table_rows(
    data_json: bytes, source: str, split: str, holdout: bool, stamp: tuple
) -> TableRows:
    import msgspec

    data = msgspec.json.decode(data_json, type=DataConfig)
    table = open_table(source, data, split)
    mapping = RowMapping.of(data, source)
    return TableRows(
        table, mapping, split_rows(table, mapping, data.holdout_every if holdout else 0)
    )


def table_rows(data: DataConfig, source: str, split: str, holdout: bool) -> TableRows:
    """The rows of ``source``'s ``split`` (read once per process and settings): with
    ``holdout``, one in ``data.holdout_every`` held out by the hash of its prompt."""
    import msgspec

    return _table_rows(msgspec.json.encode(data), source, split, holdout, _stamp(source))


def _stamp(source: str) -> tuple:
    """When and how big a local table's files are: a file edited since it was read (a
    notebook's second ``streamrl.train``) is read again, not served from the cache."""
    path = Path(source).expanduser()
    files = sorted(path.rglob("*")) if path.is_dir() else [path] if path.is_file() else []
    return tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files if f.is_file())


def source_identity(source: str, data: DataConfig) -> str:
    """What names one source however it is spelled: a task's name; a file's or a saved
    dataset's resolved path; a hub dataset's id with ``data.subset`` and ``data.revision``
    (every table is read with them), without ``hf:``.

    Example: ``./f.jsonl`` and ``/home/me/f.jsonl`` (the cwd ``/home/me``) are one source;
    ``hf:openai/gsm8k`` and ``openai/gsm8k`` are ``hub:openai/gsm8k|main|`` with subset main."""
    if task_for(source) is not None:
        return source
    try:
        kind = table_kind(source)
    except DataError:  # a missing file is still a path; reading it says what is wrong
        kind = "file"
    if kind == "hub":
        return f"hub:{source.removeprefix(HUB_PREFIX)}|{data.subset}|{data.revision}"
    return str(Path(source).expanduser().resolve())


def holds_out_rows(data: DataConfig, eval_source: str) -> bool:
    """Whether training leaves out the held-out rows of its table: evaluation reads that
    table's own split (``eval_source`` "" or the same source, by ``source_identity``) and no
    ``data.eval_split`` is named (module doc)."""
    if data.eval_split:
        return False
    return not eval_source or source_identity(eval_source, data) == source_identity(
        data.source, data
    )


class PromptStream:
    """The run's prompts by index (module doc): ``stream[i]`` is the same prompt every time.
    ``eval_source`` is ``eval.source``: whether a table's rows are held out depends on it."""

    def __init__(self, data: DataConfig, seed: int, eval_source: str = "") -> None:
        self.data, self.seed = data, seed
        self.task = task_for(data.source)
        self.rows = None
        if self.task is None:
            holdout = holds_out_rows(data, eval_source)
            self.rows = table_rows(data, data.source, data.split, holdout)
            if len(self.rows.train_rows) == 0:
                raise DataError(f"data.source {data.source}: every row is held out")
        self._order: tuple[int, np.ndarray] | None = None

    def __getitem__(self, index: int) -> Prompt:
        if index < 0:
            raise IndexError(f"prompt index {index} < 0")
        if self.task is not None:
            return self.task.question(self.data, self.seed, index, "train")
        train = self.rows.train_rows
        epoch, position = divmod(index, len(train))
        if self._order is None or self._order[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._order = (epoch, train[rng.permutation(len(train))])
        return self.rows.prompt(self._order[1][position])


def prompt_stream(config: Config) -> PromptStream:
    """The run's training stream (``data``, ``run.seed``, held out as ``eval.source`` asks)."""
    return PromptStream(config.data, config.run.seed, config.eval.source)


def prompt_source(
    data: DataConfig, seed: int, stream: int = 0, streams: int = 1
) -> Iterator[Prompt]:
    """Prompts ``stream``, ``stream + streams``, ... of the run's stream (``PromptStream``)."""
    prompts = PromptStream(data, seed)
    return (prompts[i] for i in itertools.count(stream, streams))


def evaluated_rows(config: Config) -> tuple[TableRows, np.ndarray] | None:
    """The table evaluation reads and the row numbers it draws from (module doc): the rows
    held out of ``data.split``, or every row of ``data.eval_split`` or of another
    ``eval.source``; None when ``eval.source`` (or ``data.source``) is a generated task."""
    data, ev = config.data, config.eval
    source = ev.source or data.source
    if task_for(source) is not None:
        return None
    if holds_out_rows(data, ev.source):  # the rows training leaves out of its own split
        rows = table_rows(data, source, data.split, holdout=True)
        return rows, rows.eval_rows
    rows = table_rows(data, source, data.eval_split or data.split, holdout=False)
    return rows, rows.train_rows


@dataclass(frozen=True)
class DataSides:
    """How many rows a run trains on and evaluates from, found disjoint by question."""

    training: int
    held_out: int

    def line(self) -> str:
        """Example: ``data: 7000 training rows, 1319 held-out rows (disjoint by question)``."""
        return (
            f"data: {self.training} training rows, {self.held_out} held-out rows "
            "(disjoint by question)"
        )


def _disjoint(config: Config, stream: PromptStream) -> DataSides | None:
    """``DataSides`` of a run whose both sides are tables; ``DataError`` in one line, with
    counts, when an evaluated row asks a question a training row asks (by
    ``tables.question_key``): its figures would be training accuracy."""
    evaluated = evaluated_rows(config)
    if stream.rows is None or evaluated is None:
        return None  # a task's held-out questions are apart by their key's hash
    rows, candidates = evaluated
    train_keys = stream.rows.keys[stream.rows.train_rows]
    held_keys = rows.keys[candidates]
    shared = np.isin(held_keys, train_keys)
    if shared.any():
        raise DataError(
            f"{int(shared.sum())} of {len(held_keys)} held-out rows of "
            f"{config.eval.source or config.data.source} ask a question that "
            f"{int(np.isin(train_keys, held_keys).sum())} of {len(train_keys)} training rows "
            f"of {config.data.source} ask too: evaluation would score training questions "
            "(remove them from one side, or leave eval.source and data.eval_split empty to "
            "hold out rows of data.split)"
        )
    return DataSides(len(train_keys), len(held_keys))


def check_data(config: Config) -> DataSides | None:
    """Fail early (``streamrl launch``/``validate`` and the controller, before any role
    starts) on a task's bad ``data.args`` (``ConfigError``), a source that cannot be read or
    mapped, a split a source does not have, held-out rows that share a question with training
    rows, or a task whose settings leave it no training question (``DataError``). Returns the
    row count of each side when both are tables (and logs ``DataSides.line``); None for a
    generated task, or a run that never evaluates."""
    check_task_settings(config)
    data, ev = config.data, config.eval
    evaluated = ev.source or data.source
    held_out = task_for(evaluated) is not None or holds_out_rows(data, ev.source)
    if ev.every > 0 and data.holdout_every == 0 and held_out:
        raise ConfigError(
            f"eval.source={evaluated} has no held-out questions with data.holdout_every=0 "
            "(hold some out, name data.eval_split or another eval.source, or set eval.every=0)"
        )
    stream = prompt_stream(config)
    stream[0]
    if ev.every == 0 and not ev.before_train:
        return None  # nothing is evaluated in the run (the controller asks the same)
    sides = _disjoint(config, stream)
    if sides is not None:
        log.info(sides.line())
    return sides


def data_fingerprint(config: Config) -> dict[str, Any]:
    """What a run's prompt stream is made of, for a resumed run to be checked against
    (``controller.rundir.check_resume_pinned``): ``run.seed``, the ``data`` section (its
    source as ``source_identity``) and, for a table, the training rows' count and digest
    (``tables.RowSplit``: their content, so a file edited or a hub dataset re-downloaded at a
    newer revision is told apart). JSON-ready.

    Example: ``{"seed": 1, "data": {"source": "/abs/gsm.jsonl", ...}, "table": {"rows":
    35, "digest": "9f..."}}``; ``"table"`` is None for a generated task."""
    import msgspec

    data = msgspec.to_builtins(config.data)
    data["source"] = source_identity(config.data.source, config.data)
    stream = prompt_stream(config)
    table = None
    if stream.rows is not None:
        table = {"rows": len(stream.rows.train_rows), "digest": stream.rows.digest}
    return {"seed": config.run.seed, "data": data, "table": table}
