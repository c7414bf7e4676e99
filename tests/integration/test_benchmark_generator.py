"""benchmarks/generator.py, learner.py and peer_loop.py run end to end on the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _benchmark(script: str, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


@pytest.mark.slow
def test_generator_benchmark_prints_its_table(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    args = ["--model", "tiny-random-llama", "--batches", "1,2", "--new-tokens", "4"]
    proc = _benchmark("generator.py", *args, "--threads", "1", "--json", str(out))
    assert "device " in proc.stdout and "roofline(B) = min(" in proc.stdout
    header = next(line for line in proc.stdout.splitlines() if line.lstrip().startswith("batch"))
    assert header.split() == ["batch", "engine", "greedy", "sampled", "roofline", "%roof"]
    rows = json.loads(out.read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 2]
    assert all(r[k] > 0 for r in rows for k in ("engine", "greedy", "sampled", "roofline"))


@pytest.mark.slow
def test_learner_benchmark_times_a_shared_prompt_step(tmp_path: Path) -> None:
    out = tmp_path / "learner.json"
    args = ["--model", "tiny-random-llama", "--batch", "8", "--group-size", "4"]
    args += ["--share-prompts", "--prompt-tokens", "8", "--response-tokens", "4", "--spread"]
    proc = _benchmark("learner.py", *args, "--steps", "1", "--threads", "1", "--json", str(out))
    assert "streamrl (1 rank):" in proc.stdout
    results = json.loads(out.read_text())["results"]
    assert {"plain (1 process)", "streamrl (1 rank)"} <= set(results)
    assert all(r["s_per_step"] > 0 for r in results.values())


@pytest.mark.slow
def test_peer_loop_trains_and_compares(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"results": [{"mode": "sync", "eta": 0, "samples_per_s": 1.0}]}))
    args = ["--config", "configs/tiny.yaml", "--steps", "2", "--warmup", "1", "--threads", "1"]
    proc = _benchmark("peer_loop.py", *args, "--compare", str(results))
    assert "single-process loop:" in proc.stdout and "trained samples/s" in proc.stdout
    assert "streamrl sync (split): 1.00 trained samples/s" in proc.stdout
    assert "oneDNN bf16" in proc.stdout  # the CPU line is printed


@pytest.mark.slow
def test_generator_benchmark_runs_the_vllm_engine(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    out = tmp_path / "figures.json"
    args = ["--engine", "vllm", "--batches", "2", "--new-tokens", "4", "--repeats", "1"]
    args += ["--eval-job", ""]  # the held-out evaluation's timing is the HF table's test's
    proc = _benchmark("generator.py", *args, "--job-call", "2,2,16,2", "--json", str(out))
    assert "engine vllm (VLLMEngine)" in proc.stdout and "apply a version:" in proc.stdout
    figures = json.loads(out.read_text())
    assert figures["engine"] == "vllm" and figures["rows"][0]["engine"] > 0
    assert figures["job_call_ms"] > 0 and figures["update_s"]["all"] > 0
