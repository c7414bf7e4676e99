"""What the model answered: the held-out responses each evaluation keeps (``eval.keep_answers``).

A run's figures say that accuracy fell; its answers say why ("a + b = 10." for every question, one
expression for every puzzle). Each evaluation keeps the responses to the first N held-out prompts
(the same prompts every time, so one question can be followed across versions), all their
samples, with the question, the rules' score, each served reward's score and the check:

- ``keep(samples, questions, served, labels, n)``, on generator 0, picks them into the
  ``EvalReport`` (``protocol.EvalAnswer``).
- ``AnswersLog``, in the controller, appends them to ``RUN_DIR/answers.jsonl`` (one line per
  response, with the version, the step it was asked at and the learner epoch) and gives wandb
  its ``eval/answers`` table.
- ``read_answers(run_dir)`` reads the file back (``streamrl answers``).

Example: with ``keep_answers: 2`` and ``eval.samples: 1`` an evaluation of version 10 adds two
lines: ``{"version": 10, "requested": 10, "epoch": 0, "prompt_id": "eval-0", "question": "What
is 3 + 4?", "response": "7", "ground_truth": "7", "reward": 1.0, "exact": true, ...}``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec

from streamrl.protocol import EvalAnswer, EvalReport

ANSWERS_FILE = "answers.jsonl"
COLUMNS = ("version", "prompt_id", "question", "response", "ground_truth", "reward", "exact")

# The served rewards' scores of an evaluation, by reward index: one per response (None: none).
ServedScores = Mapping[int, list[float | None]]


def keep(
    samples: list[dict[str, Any]],
    questions: Callable[[], dict[str, str]],
    served: ServedScores,
    labels: Callable[[int], str],
    n: int,
) -> list[EvalAnswer]:
    """The responses to the first ``n`` distinct prompts of ``samples`` (an ``EvalResult``'s,
    in evaluation order), each with its question (``questions()``: prompt id -> text, read only
    when something is kept) and its served scores (``labels``: a reward index's label)."""
    if n <= 0 or not samples:
        return []
    prompts: set[str] = set()
    picked: list[int] = []
    for i, sample in enumerate(samples):
        if sample["prompt_id"] not in prompts:
            if len(prompts) == n:
                continue
            prompts.add(sample["prompt_id"])
        picked.append(i)
    asked = questions()
    return [
        EvalAnswer(
            prompt_id=str(samples[i]["prompt_id"]),
            question=asked.get(samples[i]["prompt_id"], ""),
            response=str(samples[i]["response"]),
            ground_truth=str(samples[i]["ground_truth"]),
            reward=float(samples[i]["reward"]),
            exact=bool(samples[i]["exact"]),
            stopped=bool(samples[i]["stopped"]),
            served={labels(r): scores[i] for r, scores in served.items() if i < len(scores)},
        )
        for i in picked
    ]


class AnswersLog:
    """``RUN_DIR/answers.jsonl``, appended by the controller as evaluations come in."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / ANSWERS_FILE

    def append(self, report: EvalReport) -> list[dict[str, Any]]:
        """Write ``report``'s answers (nothing without any); return the rows written."""
        rows = [
            {
                "version": report.version,
                "requested": report.requested,
                "epoch": report.weights_epoch,
                **msgspec.to_builtins(answer),
            }
            for answer in report.answers
        ]
        if rows:
            with self.path.open("a") as f:
                f.writelines(json.dumps(row) + "\n" for row in rows)
        return rows


def wandb_table(rows: list[dict[str, Any]]) -> Any:
    """The rows as a ``wandb.Table`` (``COLUMNS`` and one per served reward)."""
    import wandb

    served = sorted({label for row in rows for label in row.get("served", {})})
    columns = [*COLUMNS, *served]
    data = [[row[c] for c in COLUMNS] + [row["served"].get(s) for s in served] for row in rows]
    return wandb.Table(columns=columns, data=data)


def read_answers(run_dir: Path) -> Iterator[dict[str, Any]]:
    """The kept answers of ``run_dir``, in the order written; a torn last line (a run killed
    mid-write) is skipped."""
    path = run_dir / ANSWERS_FILE
    if not path.exists():
        return
    with path.open() as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def format_answers(
    rows: list[dict[str, Any]], prompt_id: str | None = None, version: int | None = None
) -> list[str]:
    """``streamrl answers``: the kept answers by prompt, each prompt's question once, then one
    line per response by version: ``v 10  exact  1.00  | 7``. ``prompt_id``/``version`` filter."""
    chosen = [
        row
        for row in rows
        if (prompt_id is None or row["prompt_id"] == prompt_id)
        and (version is None or row["version"] == version)
    ]
    lines: list[str] = []
    by_prompt: dict[str, list[dict[str, Any]]] = {}
    for row in chosen:
        by_prompt.setdefault(row["prompt_id"], []).append(row)
    for pid, answers in by_prompt.items():
        question = " ".join(answers[0]["question"].split())
        lines.append(f"{pid}: {question[:100]}  (truth: {answers[0]['ground_truth'][:40]})")
        for row in answers:
            served = "".join(
                f" {label} {'-' if score is None else f'{score:.2f}'}"
                for label, score in sorted(row.get("served", {}).items())
            )
            mark = "exact" if row["exact"] else "wrong"
            response = " ".join(row["response"].split())
            lines.append(
                f"  v{row['version']:>4}  {mark}  {row['reward']:5.2f}{served}  | {response[:120]}"
            )
    return lines
