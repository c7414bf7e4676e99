"""README.md's "Your own model, data and reward" snippets run as written (issue 43, item 7),
on the tiny model: the YAML job through ``streamrl launch`` and the Python one through
``streamrl.train``, each in a fresh process in a directory holding the files they name
(``data/train.jsonl`` in GSM8K's layout, ``my_rewards.py``). The test changes only the model
(to ``tiny-random-llama``), the step count and where the run directory goes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["run.max_steps=2", "generator.max_new_tokens=16", "run.name=snippet"]


def snippet(name: str) -> str:
    """The fenced block right after ``<!-- snippet: NAME`` in README.md."""
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- snippet: {re.escape(name)}\b.*?-->\s*```\w+\n(.*?)```", text, re.S)
    assert match, f"README.md has no snippet {name}"
    return match.group(1)


def workdir(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    rows = [
        {"question": f"Tom has {i} cards and gets 5 more. How many?", "answer": f"#### {i + 5}"}
        for i in range(32)
    ]
    (tmp_path / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "my_rewards.py").write_text(
        "def brevity(sample) -> float:\n    return 1.0 if len(sample.response_ids) < 64 else 0.0\n"
    )
    return tmp_path


def env_for(cwd: Path) -> dict[str, str]:
    paths = [str(cwd), os.environ.get("PYTHONPATH", "")]
    return os.environ | {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def summary_of(cwd: Path) -> dict:
    return json.loads((cwd / "out" / "snippet" / "summary.json").read_text())


def test_the_yaml_snippet_launches(tmp_path: Path) -> None:
    cwd = workdir(tmp_path)
    (cwd / "my_job.yaml").write_text(snippet("own-data-yaml"))
    command = [sys.executable, "-m", "streamrl.cli", "launch", "my_job.yaml"]
    command += ["model.name=tiny-random-llama", "run.output_dir=out", *SMALL]
    done = subprocess.run(command, cwd=cwd, env=env_for(cwd), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = summary_of(cwd)
    assert summary["version"] == 2 and summary["eval"]
    assert summary["sampler"] is not None  # data.sampler: difficulty


def test_the_python_snippet_trains(tmp_path: Path) -> None:
    cwd = workdir(tmp_path)
    code = snippet("own-data-python")
    model = 'model="smollm2-135m-instruct",'
    assert model in code
    small = [*SMALL, "run.output_dir=out"]
    code = code.replace(model, f'model="tiny-random-llama", overrides={small!r},')
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env_for(cwd), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = summary_of(cwd)
    assert summary["version"] == 2 and summary["eval"]
    assert "snippet" in done.stdout  # print(result.final_eval, result.run_dir)
