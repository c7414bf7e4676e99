"""A hub dataset as ``data.source``, downloaded through the hub's HTTP API (a local
``HubServer`` on 127.0.0.1 stands in for huggingface.co), in the process that reads it and in a
``streamrl`` subprocess; offline, a dataset never downloaded is refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hub_server import GSM8K_README, HubServer, hub_env, use_hub

from streamrl.config import load_config
from streamrl.data import DataError, check_data, prompt_stream
from streamrl.evaluation import eval_prompts

pytestmark = pytest.mark.slow

OVERRIDES = [
    "data.source=openai/gsm8k",
    "data.subset=main",
    "data.eval_split=test",
    "data.prompt_key=question",
    "data.answer_key=answer",
    "data.answer_pattern='####\\s*(.+)'",
    "eval.max_prompts=100",
]


def gsm8k_repo(root: Path) -> Path:
    """openai/gsm8k's layout: config ``main``, train and test Parquet shards."""
    (root / "main").mkdir(parents=True)
    (root / "README.md").write_text(GSM8K_README)
    for split, numbers in (("train", range(40)), ("test", range(100, 110))):
        rows = {
            "question": [f"What is {n} plus 1?" for n in numbers],
            "answer": [f"{n} + 1 = {n + 1}\n#### {n + 1}" for n in numbers],
        }
        pq.write_table(pa.table(rows), root / "main" / f"{split}-00000-of-00001.parquet")
    return root


def test_a_hub_dataset_downloads_and_maps(tmp_path: Path, monkeypatch) -> None:
    repo = gsm8k_repo(tmp_path / "repo")
    with HubServer({"openai/gsm8k": repo}, kinds={"openai/gsm8k": "dataset"}) as hub:
        use_hub(monkeypatch, hub, tmp_path / "hf")
        config = load_config(None, OVERRIDES)
        check_data(config)
        stream = prompt_stream(config)
        assert len(stream.rows.train_rows) == 40  # the test split is evaluated, not held out
        prompt = stream[0]
        n = int(prompt.messages[-1]["content"].split()[2])
        assert prompt.ground_truth == str(n + 1) and prompt.data_source == "openai/gsm8k"
        held = eval_prompts(config)
        assert {p.ground_truth for p in held} == {str(n + 1) for n in range(100, 110)}
        assert any(path.endswith("train-00000-of-00001.parquet") for path in hub.requests)


def validate(env: dict[str, str]) -> subprocess.CompletedProcess:
    """``streamrl validate`` of the hub job in a process of its own, with ``env``."""
    command = [sys.executable, "-m", "streamrl.cli", "validate", "tiny", *OVERRIDES]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def test_streamrl_validate_downloads_in_its_own_process(tmp_path: Path) -> None:
    repo = gsm8k_repo(tmp_path / "repo")
    with HubServer({"openai/gsm8k": repo}, kinds={"openai/gsm8k": "dataset"}) as hub:
        done = validate(hub_env(hub, tmp_path / "hf"))
        assert done.returncode == 0, done.stderr
        assert "source: openai/gsm8k" in done.stdout
        assert any(path.endswith("test-00000-of-00001.parquet") for path in hub.requests)
    # Offline, with nothing cached under a fresh HF_HOME: one line, exit 2.
    done = validate(hub_env(hub, tmp_path / "empty-hf") | {"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2
    error = done.stderr.strip().splitlines()
    assert len(error) == 1 and "data.source openai/gsm8k" in error[0], done.stderr
    assert "HF_HUB_OFFLINE" in error[0]


def test_a_missing_hub_dataset_is_one_line(tmp_path: Path, monkeypatch) -> None:
    with HubServer({}, kinds={}) as hub:
        use_hub(monkeypatch, hub, tmp_path / "hf")
        config = load_config(None, ["data.source=nobody/nothing", "eval.every=0"])
        with pytest.raises(DataError, match="data.source nobody/nothing") as info:
            check_data(config)
        assert "\n" not in str(info.value)
    assert json.dumps(str(info.value))  # printable as one line
