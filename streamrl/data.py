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
``data.holdout_every`` (``tasks.base.held_out``); for a table, ``data.eval_split`` when named,
else its rows whose prompt hashes likewise, when evaluation reads the same table
(``eval.source`` "" or ``data.source``; another eval source leaves every row to training).
Rows whose answer ``data.answer_pattern`` does not match are skipped, and counted.

``Prompt``, ``DataError`` and the arithmetic task's functions are defined in
``streamrl.tasks`` and re-exported here.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np

from streamrl.config import Config, ConfigError, DataConfig
from streamrl.tables import RowMapping, open_table, split_rows
from streamrl.tasks import check_task_settings, task_for
from streamrl.tasks.arithmetic import arithmetic_prompts, arithmetic_question, is_held_out
from streamrl.tasks.base import DataError, Prompt

__all__ = [
    "DataError",
    "Prompt",
    "PromptStream",
    "TableRows",
    "arithmetic_prompts",
    "arithmetic_question",
    "check_data",
    "is_held_out",
    "prompt_source",
    "table_rows",
]


class TableRows:
    """A table's rows split for training and evaluation (module doc): the Arrow table, its
    mapping, and the row numbers of each side (numpy, not the rows)."""

    def __init__(self, table: Any, mapping: RowMapping, train: np.ndarray, held: np.ndarray):
        self.table, self.mapping = table, mapping
        self.train_rows, self.eval_rows = train, held

    def prompt(self, row: int) -> Prompt:
        return self.mapping.prompt(self.table[int(row)], int(row))


@functools.lru_cache(maxsize=8)
def _table_rows(data_json: bytes, source: str, split: str, holdout: bool) -> TableRows:
    import msgspec

    data = msgspec.json.decode(data_json, type=DataConfig)
    table = open_table(source, data, split)
    mapping = RowMapping.of(data, source)
    train, held = split_rows(table, mapping, data.holdout_every if holdout else 0)
    return TableRows(table, mapping, train, held)


def table_rows(data: DataConfig, source: str, split: str, holdout: bool) -> TableRows:
    """The rows of ``source``'s ``split`` (read once per process and settings): with
    ``holdout``, one in ``data.holdout_every`` held out by the hash of its prompt."""
    import msgspec

    return _table_rows(msgspec.json.encode(data), source, split, holdout)


def holds_out_rows(data: DataConfig, eval_source: str) -> bool:
    """Whether training leaves out the held-out rows of its table (module doc)."""
    return not data.eval_split and eval_source in ("", data.source)


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


def check_data(config: Config) -> None:
    """Fail early (``streamrl launch``/``validate`` and the controller, before any role
    starts) on a task's bad ``data.args`` (``ConfigError``), a source that cannot be read or
    mapped, or a task whose settings leave it no training question (``DataError``)."""
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
