"""Held-out rows are never training rows, whatever the source kinds (``streamrl.tables``,
``streamrl.data``; issue 52): a file or a saved ``Dataset`` has one split, sources are compared
by what they name rather than how they are spelled, and ``check_data`` refuses evaluated rows
that ask a training question, saying how many rows each side has."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import datasets
import msgspec
import pytest
from test_tables import GSM_TEMPLATE, gsm_rows, write_jsonl

from streamrl.config import Config, load_config
from streamrl.data import DataError, DataSides, check_data, prompt_stream, source_identity
from streamrl.evaluation import eval_prompts


def gsm_config(source: str, *overrides: str) -> Config:
    """The README's GSM8K mapping over ``source``, evaluated; the mapping set on the struct, so
    what is tested is the data, not how a command line's regex is read."""
    config = load_config(
        None, [f"data.source={source}", "eval.max_prompts=1000", "eval.every=5", *overrides]
    )
    data = msgspec.structs.replace(
        config.data,
        prompt_template=GSM_TEMPLATE,
        answer_key="answer",
        answer_pattern=r"####\s*(.+)",
    )
    return msgspec.structs.replace(config, data=data)


def trained_keys(config: Config) -> set[str]:
    rows = prompt_stream(config).rows
    return {rows.prompt(row).key for row in rows.train_rows}


def test_a_file_has_no_test_split_a_gsm8k_jsonl_with_eval_split_is_refused(
    tmp_path: Path,
) -> None:
    # Before: read as "train" whatever the split, so all 40 evaluated rows were trained on.
    path = write_jsonl(tmp_path / "gsm.jsonl", gsm_rows(40))
    config = gsm_config(str(path), "data.eval_split=test")
    for call in (check_data, eval_prompts):
        with pytest.raises(DataError, match=r"a file has one split, 'train', not 'test'") as info:
            call(config)
        assert "\n" not in str(info.value) and "eval.source" in str(info.value)
    with pytest.raises(DataError, match=r"not 'validation'"):
        check_data(gsm_config(str(path), "data.split=validation"))  # not silently "train"


def test_a_saved_plain_dataset_has_one_split(tmp_path: Path) -> None:
    datasets.Dataset.from_list(gsm_rows(24)).save_to_disk(str(tmp_path / "saved"))
    config = gsm_config(str(tmp_path / "saved"), "data.eval_split=test")
    with pytest.raises(DataError, match=r"saved Dataset \(not a DatasetDict\) has one split"):
        check_data(config)
    with pytest.raises(DataError, match=r"one split, 'train', not 'test'"):
        eval_prompts(config)
    # Its one split trains, with one row in 8 held out of it.
    sides = check_data(gsm_config(str(tmp_path / "saved")))
    assert sides is not None and sides.training + sides.held_out == 24


def test_the_data_file_named_another_way_as_eval_source_is_still_held_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_jsonl(tmp_path / "gsm.jsonl", gsm_rows(40))
    monkeypatch.chdir(tmp_path)
    relative = gsm_config("./gsm.jsonl", f"eval.source={path}")
    absolute = gsm_config(str(path), "eval.source=gsm.jsonl")
    for config in (relative, absolute):
        # Before: compared as strings, another table: every row trained on and evaluated.
        held = eval_prompts(config)
        assert held and not {p.key for p in held} & trained_keys(config)
        sides = check_data(config)
        assert sides is not None and sides.training + sides.held_out == 40
        assert 0 < sides.held_out < 40


def test_source_identity_is_what_a_source_names() -> None:
    data = load_config(None, ["data.subset=main"]).data
    here = Path("rows.jsonl").resolve()
    assert source_identity("rows.jsonl", data) == source_identity(str(here), data)
    assert source_identity(f"./{os.path.relpath(here)}", data) == str(here)
    assert source_identity("hf:openai/gsm8k", data) == source_identity("openai/gsm8k", data)
    assert source_identity("openai/gsm8k", data) == "hub:openai/gsm8k|main|"
    assert source_identity("arithmetic", data) == "arithmetic"


def test_disjoint_files_pass_with_each_sides_row_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows = gsm_rows(30)
    train = write_jsonl(tmp_path / "train.jsonl", rows[:24])
    held = write_jsonl(tmp_path / "test.jsonl", rows[24:])
    with caplog.at_level(logging.INFO, logger="streamrl.data"):
        sides = check_data(gsm_config(str(train), f"eval.source={held}"))
    assert sides == DataSides(training=24, held_out=6)
    assert "data: 24 training rows, 6 held-out rows (disjoint by question)" in caplog.text
    # A saved DatasetDict's two splits: disjoint, counted the same way.
    splits = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(rows[:20]),
            "test": datasets.Dataset.from_list(rows[20:]),
        }
    )
    splits.save_to_disk(str(tmp_path / "dict"))
    config = gsm_config(str(tmp_path / "dict"), "data.eval_split=test")
    assert check_data(config) == DataSides(training=20, held_out=10)


def test_held_out_rows_that_ask_a_training_question_are_refused_with_counts(
    tmp_path: Path,
) -> None:
    rows = gsm_rows(30)
    train = write_jsonl(tmp_path / "train.jsonl", rows[:24])
    # Six rows of their own and four of training's, one of them twice.
    held = write_jsonl(tmp_path / "test.jsonl", rows[24:] + rows[:3] + rows[:1])
    with pytest.raises(DataError) as info:
        check_data(gsm_config(str(train), f"eval.source={held}"))
    message = str(info.value)
    assert "4 of 10 held-out rows" in message and "3 of 24 training rows" in message
    assert "\n" not in message
    # The same rows as a DatasetDict's splits: refused the same way.
    splits = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(rows[:24]),
            "test": datasets.Dataset.from_list(rows[24:] + rows[:3]),
        }
    )
    splits.save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(DataError, match="3 of 9 held-out rows"):
        check_data(gsm_config(str(tmp_path / "dict"), "data.eval_split=test"))


def test_a_generated_task_has_no_row_counts() -> None:
    assert check_data(load_config(None, [])) is None
