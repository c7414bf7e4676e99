"""Prompt sources (DESIGN.md §7).

A source yields ``Prompt``s forever (it cycles through a file; the arithmetic task is
procedurally generated from a seed). Generators take prompts from disjoint streams: source
``k`` of ``m`` sees every ``m``-th prompt, so no two generators work on the same prompt.

File layout follows verl: ``prompt`` (chat messages or a string), the answer in
``reward_model.ground_truth`` or ``ground_truth``, and an optional ``data_source``.
"""

from __future__ import annotations

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


def arithmetic_prompts(
    config: DataConfig, seed: int, stream: int, streams: int, split: str = "train"
) -> Iterator[Prompt]:
    """Seeded arithmetic questions, e.g. ``What is 7 + 12?`` with ground truth ``19``
    (``data.question_template`` words the question).

    ``split="train"`` never yields a held-out question (``data.holdout_every``) and
    ``split="eval"`` yields only those, so evaluation measures questions training never saw."""
    rng = random.Random(f"{seed}:{stream}")
    index = stream
    while True:
        a, b = rng.randint(0, config.max_operand), rng.randint(0, config.max_operand)
        op = rng.choice(config.operations)
        if is_held_out(a, op, b, config.holdout_every) != (split == "eval"):
            continue
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        messages = []
        if config.system_prompt:
            messages.append({"role": "system", "content": config.system_prompt})
        question = config.question_template.format(a=a, op=op, b=b)
        messages.append({"role": "user", "content": question})
        yield Prompt(f"arith-{index}", messages, str(answer), "arithmetic")
        index += streams


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


def file_prompts(prompts: list[Prompt], seed: int, stream: int, streams: int) -> Iterator[Prompt]:
    """Cycle through this stream's share of the prompts, reshuffled every epoch."""
    share = prompts[stream::streams] or prompts
    rng = random.Random(f"{seed}:{stream}")
    while True:
        order = list(share)
        rng.shuffle(order)
        yield from order


def prompt_source(
    config: DataConfig, seed: int, stream: int = 0, streams: int = 1
) -> Iterator[Prompt]:
    if config.source == "arithmetic":
        return arithmetic_prompts(config, seed, stream, streams)
    return file_prompts(load_prompt_file(config.source), seed, stream, streams)


def check_data(config: DataConfig) -> None:
    """Fail early (in the controller) on a missing or malformed prompt file."""
    if config.source != "arithmetic":
        load_prompt_file(config.source)
