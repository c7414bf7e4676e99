"""Prompt sources (docs/design.md §7).

A run has one prompt stream with random access: ``PromptStream(config, seed)[i]`` is prompt
``i``, the same on every machine (the arithmetic task draws question ``i`` from a generator
seeded by ``(seed, i)``; a file is cycled through, reshuffled every epoch from ``(seed,
epoch)``). The controller's admission hands out indices (``controller.admission``), so no two
generators work on the same prompt however many come and go, and a resumed run continues the
stream instead of replaying it.

File layout follows verl: ``prompt`` (chat messages or a string), the answer in
``reward_model.ground_truth`` or ``ground_truth``, and an optional ``data_source``.
"""

from __future__ import annotations

import itertools
import json
import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrl.config import DataConfig


class DataError(ValueError):
    """A prompt file that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    messages: list[dict[str, str]]
    ground_truth: str
    data_source: str


def is_held_out(a: int, op: str, b: int, every: int) -> bool:
    """Whether the question ``a op b`` belongs to the evaluation split: one question in
    ``every`` (0: none), chosen by a hash of the question, the same on every machine."""
    return every > 0 and zlib.crc32(f"{a}{op}{b}".encode()) % every == 0


def arithmetic_question(
    config: DataConfig,
    seed: int,
    index: int,
    split: str = "train",
    phrasing: tuple[str, str] | None = None,
) -> Prompt:
    """Question ``index`` of the seeded stream, e.g. ``What is 7 + 12?`` with ground truth
    ``19``. ``split="train"`` never yields a held-out question (``data.holdout_every``) and
    ``split="eval"`` yields only those, so evaluation measures questions training never saw.

    Wording: a training question draws its template from ``data.question_template`` and
    ``data.question_templates`` and drops the system prompt with probability
    ``data.no_system_prompt_share`` (both from the question's own seed, after its numbers,
    so the numbers do not depend on the wordings); an eval question keeps
    ``question_template`` with the system prompt. ``phrasing``: (template, system prompt;
    "" for none) instead, for the same question."""
    rng = random.Random(f"{seed}:{index}")
    while True:
        a, b = rng.randint(0, config.max_operand), rng.randint(0, config.max_operand)
        op = rng.choice(config.operations)
        if is_held_out(a, op, b, config.holdout_every) == (split == "eval"):
            break
    answer = {"+": a + b, "-": a - b, "*": a * b}[op]
    template, system = config.question_template, config.system_prompt
    if split == "train" and config.question_templates:
        template = rng.choice([config.question_template, *config.question_templates])
    if split == "train" and config.no_system_prompt_share > 0:
        system = "" if rng.random() < config.no_system_prompt_share else system
    template, system = phrasing or (template, system)
    messages = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": template.format(a=a, op=op, b=b)})
    return Prompt(f"arith-{index}", messages, str(answer), "arithmetic")


def arithmetic_prompts(
    config: DataConfig,
    seed: int,
    stream: int,
    streams: int,
    split: str = "train",
    phrasing: tuple[str, str] | None = None,
) -> Iterator[Prompt]:
    """Questions ``stream``, ``stream + streams``, ... of the seeded stream."""
    for index in itertools.count(stream, streams):
        yield arithmetic_question(config, seed, index, split, phrasing)


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise DataError(f"prompt file not found: {path}")
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
        self.rows = None if config.source == "arithmetic" else load_prompt_file(config.source)
        self._epoch: tuple[int, list[Prompt]] | None = None

    def __getitem__(self, index: int) -> Prompt:
        if index < 0:
            raise IndexError(f"prompt index {index} < 0")
        if self.rows is None:
            return arithmetic_question(self.config, self.seed, index)
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
    """Fail early (in the controller) on a missing or malformed prompt file."""
    if config.source != "arithmetic":
        load_prompt_file(config.source)
