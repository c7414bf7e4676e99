"""A user's rows as prompts (``streamrl.tables``, ``streamrl.data``): every table kind through
one mapping, the held-out split, and bad input refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamrl.config import ConfigError, load_config
from streamrl.data import DataError, PromptStream, check_data, prompt_stream
from streamrl.evaluation import eval_prompts, exact_check

GSM_TEMPLATE = "{question}\nEnd with #### and the answer."


def gsm_rows(n: int) -> list[dict]:
    """GSM8K's layout: a question and a worked answer ending in ``#### N``."""
    return [
        {
            "question": f"Ann has {i} apples and buys 2. How many now?",
            "answer": f"{i}+2\n#### {i + 2}",
        }
        for i in range(n)
    ]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def gsm_config(source: str, *extra: str):
    return load_config(
        None,
        [
            f"data.source={source}",
            "data.prompt_template=" + json.dumps(GSM_TEMPLATE),
            "data.answer_key=answer",
            "data.answer_pattern='####\\s*(.+)'",
            "eval.max_prompts=1000",
            "eval.every=5",
            *extra,
        ],
    )


def test_a_gsm8k_layout_jsonl_maps_by_template_and_answer_pattern(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "gsm.jsonl", gsm_rows(80))
    config = gsm_config(str(path))
    check_data(config)
    stream = prompt_stream(config)
    train = [stream[i] for i in range(len(stream.rows.train_rows))]
    held = eval_prompts(config)
    first = train[0]
    assert first.messages[-1]["content"].endswith("End with #### and the answer.")
    number = int(first.messages[-1]["content"].split()[2])
    assert first.ground_truth == str(number + 2)  # the pattern's group, not the worked answer
    assert first.metadata["answer"].endswith(f"#### {number + 2}")  # the row reaches rewards
    # One row in 8 is held out by its prompt's hash: disjoint, together the whole file.
    train_questions = {p.messages[-1]["content"] for p in train}
    held_questions = {p.messages[-1]["content"] for p in held}
    assert not train_questions & held_questions
    assert len(train_questions) + len(held_questions) == 80
    assert 3 <= len(held) <= 20
    # The stream cycles its rows, reshuffled per pass, the same for the same seed.
    passes = len(train)
    assert {stream[passes + i].prompt_id for i in range(passes)} == {p.prompt_id for p in train}
    assert [stream[i].prompt_id for i in range(passes)] != [
        stream[passes + i].prompt_id for i in range(passes)
    ]
    again = prompt_stream(config)
    assert [again[i].prompt_id for i in range(10)] == [p.prompt_id for p in train[:10]]


def test_the_rows_stay_memory_mapped_arrow(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "gsm.jsonl", gsm_rows(20))
    rows = prompt_stream(gsm_config(str(path))).rows
    assert isinstance(rows.table, datasets.Dataset)
    assert rows.table.cache_files  # backed by Arrow files on disk, not Python lists
    assert rows.train_rows.dtype.kind == "i"


def test_verl_layout_is_the_default_mapping_for_parquet_and_csv(tmp_path: Path) -> None:
    table = pa.table(
        {
            "prompt": [[{"role": "user", "content": f"{i}+{i}?"}] for i in range(16)],
            "reward_model": [{"ground_truth": str(2 * i)} for i in range(16)],
            "data_source": ["toy"] * 16,
        }
    )
    pq.write_table(table, tmp_path / "train.parquet")
    config = load_config(
        None, [f"data.source={tmp_path / 'train.parquet'}", "data.holdout_every=0"]
    )
    stream = prompt_stream(config)
    prompts = {stream[i].messages[0]["content"]: stream[i] for i in range(16)}
    assert prompts["3+3?"].ground_truth == "6"
    assert prompts["3+3?"].data_source == "toy"
    (tmp_path / "t.csv").write_text("q,ground_truth\nhi,3\nyo,4\n")
    config = load_config(
        None, [f"data.source={tmp_path / 't.csv'}", "data.prompt_key=q", "data.holdout_every=0"]
    )
    assert {prompt_stream(config)[i].ground_truth for i in range(2)} == {"3", "4"}


def test_a_saved_dataset_dict_trains_on_its_split_and_evaluates_on_another(
    tmp_path: Path,
) -> None:
    rows = gsm_rows(30)
    saved = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(rows[:20]),
            "test": datasets.Dataset.from_list(rows[20:]),
        }
    )
    saved.save_to_disk(str(tmp_path / "saved"))
    config = gsm_config(str(tmp_path / "saved"), "data.eval_split=test")
    stream = prompt_stream(config)
    assert len(stream.rows.train_rows) == 20  # nothing held out of train: test is evaluated
    held = {p.ground_truth for p in eval_prompts(config)}
    assert held == {str(i + 2) for i in range(20, 30)}
    with pytest.raises(DataError, match=r"no split 'validation' \(splits: train, test\)"):
        prompt_stream(gsm_config(str(tmp_path / "saved"), "data.split=validation"))


def test_another_eval_source_leaves_every_row_to_training(tmp_path: Path) -> None:
    train = write_jsonl(tmp_path / "train.jsonl", gsm_rows(24))
    held = write_jsonl(tmp_path / "held.jsonl", gsm_rows(30)[24:])
    config = gsm_config(str(train), f"eval.source={held}")
    assert len(prompt_stream(config).rows.train_rows) == 24
    assert len(eval_prompts(config)) == 6


def test_max_rows_and_a_system_prompt(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "gsm.jsonl", gsm_rows(50))
    config = gsm_config(str(path), "data.max_rows=10", "data.system_prompt=Think.")
    stream = prompt_stream(config)
    assert len(stream.rows.train_rows) + len(stream.rows.eval_rows) == 10
    assert stream[0].messages[0] == {"role": "system", "content": "Think."}


def test_eval_check_names_a_reward(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "gsm.jsonl", gsm_rows(16))
    config = gsm_config(str(path), "eval.check=exact_match")
    prompt = eval_prompts(config)[0]
    check = exact_check(config)
    assert check(prompt, prompt.ground_truth) and not check(prompt, "nope")


@pytest.mark.parametrize(
    ("rows", "overrides", "message"),
    [
        (
            [{"question": "q", "answer": "#### 1"}],
            ["data.answer_key=answer"],
            r"row 0: no column 'prompt' for data.prompt_key \(columns: question, answer\)",
        ),
        (
            [{"question": "q", "answer": "1"}],
            ["data.prompt_key=question"],
            r"no ground truth at reward_model.ground_truth or ground_truth",
        ),
        (
            [{"question": f"q{i}", "answer": "#### 1" if i < 2 else "1"} for i in range(10)],
            [
                "data.prompt_key=question",
                "data.answer_key=answer",
                "data.answer_pattern='####(.+)'",
            ],
            r"matches the answer of 2 of 10 rows \(first miss: row 2\)",
        ),
        (
            [{"question": "q", "answer": "1"}],
            ["data.prompt_template='{query} now'", "data.answer_key=answer"],
            r"data.prompt_template names 'query' but the row has only question, answer",
        ),
        (
            [{"prompt": 3, "ground_truth": "1"}],
            [],
            r"'prompt' must be a string or a list of chat messages, not int",
        ),
        (
            [{"prompt": "q", "ground_truth": "1"}],
            ["data.reference_key=solution"],
            r"row 0: no reference response at 'solution' \(data.reference_key; columns: prompt",
        ),
    ],
)
def test_a_table_the_mapping_cannot_read_is_refused_in_one_line(
    tmp_path: Path, rows: list[dict], overrides: list[str], message: str
) -> None:
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    config = load_config(None, [f"data.source={path}", "data.holdout_every=0", *overrides])
    with pytest.raises(DataError, match=message) as info:
        check_data(config)
    assert "\n" not in str(info.value)


def test_files_that_cannot_be_read_are_refused_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "ground_truth": "1"}\n{not json\n')
    cases = {
        str(bad): r"bad.jsonl",
        str(tmp_path / "missing.parquet"): r"prompt file not found",
        str(tmp_path / "notes.txt"): r"unsupported prompt file type",
        str(tmp_path): r"not one written by Dataset.save_to_disk",
        "nosuchtask": r"not a built-in task \(arithmetic",
    }
    (tmp_path / "notes.txt").write_text("x")
    for source, message in cases.items():
        config = load_config(None, [f"data.source={source}", "data.holdout_every=0"])
        with pytest.raises(DataError, match=message) as info:
            check_data(config)
        assert "\n" not in str(info.value), source
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match="the file is empty"):
        PromptStream(load_config(None, [f"data.source={tmp_path / 'empty.jsonl'}"]).data, 0)
    one = datasets.Dataset.from_list([{"prompt": "a", "ground_truth": "1"}])
    splits = datasets.DatasetDict({"train": one, "test": one.filter(lambda row: False)})
    splits.save_to_disk(str(tmp_path / "splits"))
    config = load_config(None, [f"data.source={tmp_path / 'splits'}", "data.eval_split=test"])
    with pytest.raises(DataError, match="split 'test' has no rows"):
        eval_prompts(config)


def test_args_belong_to_tasks_not_tables(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="data.args is for a built-in task"):
        check_data(load_config(None, ["data.source=rows.jsonl", "data.args.max_operand=3"]))


def test_a_reference_response_comes_from_its_column(tmp_path: Path) -> None:
    """``data.reference_key``: what ``algorithm.guidance`` trains on (GSM8K's worked answer);
    without it a row has none."""
    path = write_jsonl(tmp_path / "gsm.jsonl", gsm_rows(16))
    first = prompt_stream(gsm_config(str(path), "data.reference_key=answer"))[0]
    number = int(first.messages[-1]["content"].split()[2])
    assert first.reference == f"{number}+2\n#### {number + 2}"
    assert prompt_stream(gsm_config(str(path)))[0].reference == ""
