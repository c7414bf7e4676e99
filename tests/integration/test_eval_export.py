"""Held-out evaluation in a run, `streamrl eval` and `streamrl export`, on a finished tiny run."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from streamrl.config import load_config
from streamrl.controller.run import Controller
from streamrl.evaluation import eval_prompts

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    config = load_config(
        ROOT / "configs" / "tiny.yaml",
        [
            f"run.output_dir={out}",
            "run.name=evaluated",
            "run.max_steps=4",
            "run.checkpoint_every=2",
            "eval.every=2",
            "eval.max_prompts=8",
        ],
    )
    summary = Controller(config, console=io.StringIO()).run()
    return Path(summary["run_dir"])


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamrl.cli", *args], capture_output=True, text=True, cwd=ROOT
    )


def test_eval_runs_at_the_configured_steps_and_stays_out_of_the_buffer(run_dir: Path) -> None:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r.get("event") == "eval"]
    # Before step 1, at step 2, and the final version (4).
    assert [e["requested"] for e in evals] == [0, 2, 4]
    assert [e["eval/version"] for e in evals][-1] == 4
    assert all(e["eval/prompts"] == 8 for e in evals)
    assert all("step" not in e for e in evals)  # step records stay one per learner step
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [e["requested"] for e in summary["eval"]] == [0, 2, 4]
    assert summary["wall_time_s"] > 0

    out = run_dir.parent / "buffer.parquet"
    assert _cli("buffer", "export", str(run_dir), str(out)).returncode == 0
    import pyarrow.parquet as pq

    from streamrl.models import encode_prompt, load_tokenizer, resolve_model

    config = load_config(run_dir / "config.yaml")
    tokenizer = load_tokenizer(resolve_model(config.model.name))
    held_out = {
        tuple(encode_prompt(tokenizer, p, config.data.max_prompt_tokens))
        for p in eval_prompts(config)
    }
    table = pq.read_table(out).to_pylist()
    assert table, "the run trained on nothing"
    trained = {tuple(row["prompt_ids"]) for row in table}
    assert not trained & held_out


def test_streamrl_eval_on_a_run_and_a_model(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    answer = _cli(
        "eval", str(run_dir), "tiny-random-llama", "--max-prompts", "4", "--out", str(out)
    )
    assert answer.returncode == 0, answer.stderr
    assert "exact_match" in answer.stdout and str(run_dir) in answer.stdout
    results = json.loads(out.read_text())
    assert set(results) == {str(run_dir), "tiny-random-llama"}
    assert all(len(r["samples"]) == 4 for r in results.values())


def test_streamrl_export_a_step(run_dir: Path, tmp_path: Path) -> None:
    answer = _cli("export", str(run_dir), "--step", "2", "--out", str(tmp_path / "hf2"))
    assert answer.returncode == 0, answer.stderr
    assert "version 2" in answer.stdout
    from transformers import AutoModelForCausalLM

    step2 = AutoModelForCausalLM.from_pretrained(tmp_path / "hf2")
    final = AutoModelForCausalLM.from_pretrained(run_dir / "hf")
    newest = _cli("export", str(run_dir), "--out", str(tmp_path / "hf4"))
    assert newest.returncode == 0 and "version 4" in newest.stdout
    last = AutoModelForCausalLM.from_pretrained(tmp_path / "hf4")
    same = all(a.equal(b) for a, b in zip(last.parameters(), final.parameters(), strict=True))
    moved = any(not a.equal(b) for a, b in zip(step2.parameters(), final.parameters(), strict=True))
    assert same and moved


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["export", "{tmp}/nope", "--out", "{tmp}/x"], "not a run directory"),
        (["export", "{run}", "--step", "3", "--out", "{tmp}/x"], "no checkpoint for step 3"),
        (["eval", "{tmp}/nope"], "not found"),
        (["eval", "tiny-random-llama", "--data", "{tmp}/bad.jsonl"], "invalid JSON"),
        (["eval", "tiny-random-llama", "--data", "{tmp}/missing.parquet"], "not found"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    run_dir: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "bad.jsonl").write_text(
        '{"prompt": "What is 1 + 1?", "ground_truth": "2"}\n{oops\n'
    )
    filled = [a.format(tmp=tmp_path, run=run_dir) for a in args]
    answer = _cli(*filled)
    assert answer.returncode == 2, answer.stdout + answer.stderr
    lines = answer.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], answer.stderr
