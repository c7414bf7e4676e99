"""A user's own data trains from YAML through the whole run (tiny model, real roles): a
GSM8K-layout JSONL mapped by a template and an answer pattern, and a ``save_to_disk``
dataset with its own test split; the difficulty sampler passes over questions whose groups
all scored alike."""

from __future__ import annotations

import io
import json
from pathlib import Path

import datasets
import pytest
from support import ONE_OF_EACH

from streamrl.config import load_config
from streamrl.controller.run import Controller

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def gsm_rows(n: int, start: int = 0) -> list[dict]:
    return [
        {
            "question": f"Ann has {i} pens and buys 3. How many now?",
            "answer": f"{i}+3\n#### {i + 3}",
        }
        for i in range(start, start + n)
    ]


def run(tmp_path: Path, *overrides: str) -> tuple[dict, list[dict]]:
    config = load_config(
        ROOT / "configs" / "tiny.yaml",
        [f"run.output_dir={tmp_path}", "run.max_steps=6", "eval.every=3", *ONE_OF_EACH, *overrides],
    )
    summary = Controller(config, console=io.StringIO()).run()
    lines = (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    return summary, [json.loads(line) for line in lines]


MAPPING = [
    "data.prompt_template='{question} End with #### and the number.'",
    "data.answer_key=answer",
    "data.answer_pattern='####\\s*(.+)'",
    "eval.max_prompts=100",
    "rewards=[{name: exact_match}, {name: target_token_share, weight: 0.5, args: {token_id: 27}}]",
]


def test_a_gsm8k_layout_jsonl_trains_with_the_difficulty_sampler(tmp_path: Path) -> None:
    path = tmp_path / "gsm.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in gsm_rows(24)))
    summary, records = run(
        tmp_path,
        f"data.source={path}",
        *MAPPING,
        "data.sampler=difficulty",
        "data.difficulty_keep=0.2",
        "rewards=[{name: exact_match}]",  # a random model matches nothing: every group flat
    )
    assert summary["version"] == 6
    evals = [r for r in records if "eval/exact_match" in r]
    held_out = evals[0]["eval/prompts"]
    assert 1 <= held_out <= 8  # the rows held out of the file (one in 8 by hash)
    sampler = summary["sampler"]
    # Every question came back flat, so after one pass over the 24 rows most are passed over.
    assert sampler["groups_scored"] > 0 and sampler["questions_mostly_flat"] > 0
    assert sampler["prompts_skipped"] > 0


def test_a_saved_dataset_trains_on_train_and_evaluates_on_test(tmp_path: Path) -> None:
    saved = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(gsm_rows(40)),
            "test": datasets.Dataset.from_list(gsm_rows(5, start=100)),
        }
    )
    saved.save_to_disk(str(tmp_path / "saved"))
    summary, records = run(
        tmp_path, f"data.source={tmp_path / 'saved'}", "data.eval_split=test", *MAPPING
    )
    assert summary["version"] == 6
    evals = [r for r in records if "eval/exact_match" in r]
    assert evals and all(r["eval/prompts"] == 5 for r in evals)  # the whole test split
    assert summary["sampler"] is None  # uniform
