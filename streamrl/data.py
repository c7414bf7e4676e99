"""Prompt sources (docs/design.md §7).

A run has one prompt stream with random access: ``PromptStream(config, seed)[i]`` is prompt
``i``, the same on every machine (a built-in task, ``streamrl.tasks``, draws question ``i``
from a generator seeded by ``(seed, i)``; a file is cycled through, reshuffled every epoch
from ``(seed, epoch)``). The controller's admission hands out indices
(``controller.admission``), so no two generators work on the same prompt however many come
and go, and a resumed run continues the stream instead of replaying it.

``data.source`` names a task (``TASKS``: ``arithmetic``, ``chain``, ``countdown``, ``gsm``)
or a file. File layout follows verl: ``prompt`` (chat messages or a string), the answer in
``reward_model.ground_truth`` or ``ground_truth``, and an optional ``data_source`` (which
picks the held-out exact check, ``evaluation.EXACT_CHECKS``: GSM8K's rows, ``openai/gsm8k``,
are read after ``####``).

``Prompt``, ``DataError`` and the arithmetic task's functions are defined in
``streamrl.tasks`` and re-exported here.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from streamrl.config import DataConfig
from streamrl.tasks import TASKS
from streamrl.tasks.arithmetic import arithmetic_prompts, arithmetic_question, is_held_out
from streamrl.tasks.base import DataError, Prompt

__all__ = [
    "DataError",
    "Prompt",
    "PromptStream",
    "arithmetic_prompts",
    "arithmetic_question",
    "check_data",
    "is_held_out",
    "load_prompt_file",
    "prompt_source",
]


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        tasks = "" if path.suffix else f" (built-in tasks: {', '.join(TASKS)})"
        raise DataError(f"prompt file not found: {path}{tasks}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except Exception as exc:  # pyarrow raises several types for a bad file
            raise DataError(f"{path}: not a readable Parquet file ({exc})") from None
    if path.suffix in (".jsonl", ".json"):
        rows = []
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None
        return rows
    raise DataError(f"{path}: unsupported prompt file type (use .parquet or .jsonl)")


def _row_to_prompt(row: dict[str, Any], index: int, path: Path) -> Prompt:
    raw = row.get("prompt")
    if isinstance(raw, str):
        messages = [{"role": "user", "content": raw}]
    elif isinstance(raw, list) and all(isinstance(m, dict) and "content" in m for m in raw):
        messages = [{"role": m.get("role", "user"), "content": m["content"]} for m in raw]
    else:
        raise DataError(f"{path}: row {index}: 'prompt' must be a string or a list of messages")
    reward_model = row.get("reward_model") or {}
    truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    truth = truth if truth is not None else row.get("ground_truth")
    if truth is None:
        raise DataError(
            f"{path}: row {index}: no ground truth (reward_model.ground_truth or ground_truth)"
        )
    return Prompt(
        prompt_id=str(row.get("id", f"{path.stem}-{index}")),
        messages=messages,
        ground_truth=str(truth),
        data_source=str(row.get("data_source") or path.stem),
    )


def load_prompt_file(path: str | Path) -> list[Prompt]:
    """Read and check every row up front, so a bad file fails before the run starts."""
    path = Path(path)
    rows = _read_rows(path)
    if not rows:
        raise DataError(f"{path}: no prompts")
    return [_row_to_prompt(row, i, path) for i, row in enumerate(rows)]


class PromptStream:
    """The run's prompts by index (module doc): ``stream[i]`` is the same prompt every time."""

    def __init__(self, config: DataConfig, seed: int) -> None:
        self.config, self.seed = config, seed
        self.task = TASKS.get(config.source)
        self.rows = None if self.task is not None else load_prompt_file(config.source)
        self._epoch: tuple[int, list[Prompt]] | None = None

    def __getitem__(self, index: int) -> Prompt:
        if index < 0:
            raise IndexError(f"prompt index {index} < 0")
        if self.task is not None:
            return self.task.question(self.config, self.seed, index, "train")
        epoch, position = divmod(index, len(self.rows))
        if self._epoch is None or self._epoch[0] != epoch:
            order = list(self.rows)
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
            self._epoch = (epoch, order)
        return self._epoch[1][position]


def prompt_source(
    config: DataConfig, seed: int, stream: int = 0, streams: int = 1
) -> Iterator[Prompt]:
    """Prompts ``stream``, ``stream + streams``, ... of the run's stream (``PromptStream``)."""
    prompts = PromptStream(config, seed)
    return (prompts[i] for i in itertools.count(stream, streams))


def check_data(config: DataConfig) -> None:
    """Fail early (in the controller) on a missing or malformed prompt file, or a task whose
    settings leave it no training question (``DataError``)."""
    task = TASKS.get(config.source)
    if task is None:
        load_prompt_file(config.source)
    else:
        task.question(config, 0, 0, "train")
