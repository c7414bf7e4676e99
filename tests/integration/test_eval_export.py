"""Held-out evaluation in a run, `streamrl eval` and `streamrl export`, on a finished tiny run."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from streamrl.config import load_config
from streamrl.controller.run import Controller
from streamrl.evaluation import eval_prompts
from streamrl.models.tiny import ARCHITECTURES

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


def test_evaluations_ran_in_an_idle_process_of_their_own(run_dir: Path) -> None:
    """eval.runs_on auto on CPU: generator 0's evaluation process evaluated every version
    asked (the test above), at the lowest CPU priority, none of it in the generator's loop,
    and it ended with its generator."""
    log = (run_dir / "logs" / "generator-0-eval.log").read_text()
    ready = re.search(r"evaluation process (\d+) ready \(SCHED_IDLE", log)
    assert ready, log[-2000:]
    assert not Path(f"/proc/{ready.group(1)}").exists()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "step" in r]
    assert steps[-1]["generators/eval_s_total"] == 0.0
    evals = [r for r in records if r.get("event") == "eval"]
    # The weights asked for or later: this tiny run's four steps are over before the process
    # has loaded its engine, so it anchors past version 2 (a longer run's are exact).
    assert all(e["eval/version"] >= e["requested"] for e in evals)


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


def test_keep_best_makes_the_best_version_the_runs_model(run_dir: Path, tmp_path: Path) -> None:
    """eval.keep_best at the end of a run whose version 2 scored best: hf/ becomes version 2's
    model, read from its checkpoint, and the last version's moves to hf-last/."""
    import shutil

    from transformers import AutoModelForCausalLM

    from streamrl.controller.records import keep_best
    from streamrl.protocol import EvalReport

    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("buffer", "record", "logs"))
    metric = "eval/exact_match"
    evals = [EvalReport(0, v, v, {metric: x}, 0.0) for v, x in ((0, 0.0), (2, 0.5), (4, 0.25))]
    assert keep_best(evals, metric, run, io.StringIO()) == 2
    assert _cli("export", str(run), "--step", "2", "--out", str(tmp_path / "hf2")).returncode == 0
    kept = AutoModelForCausalLM.from_pretrained(run / "hf")
    step2 = AutoModelForCausalLM.from_pretrained(tmp_path / "hf2")
    last = AutoModelForCausalLM.from_pretrained(run / "hf-last")
    final = AutoModelForCausalLM.from_pretrained(run_dir / "hf")
    pairs = zip(kept.parameters(), step2.parameters(), strict=True)
    assert all(a.equal(b) for a, b in pairs)
    assert all(a.equal(b) for a, b in zip(last.parameters(), final.parameters(), strict=True))
    assert (run / "hf" / "tokenizer_config.json").is_file()


def test_a_run_keeping_its_best_prunes_the_checkpoints_it_cannot_choose(tmp_path: Path) -> None:
    """keep_best with keep_checkpoints 1 in a whole run: of the checkpoints at 2, 4 and 6
    only the newest and the best evaluated version's stay, and hf/ holds the version the
    summary names."""
    config = load_config(
        ROOT / "configs" / "tiny.yaml",
        [
            f"run.output_dir={tmp_path}",
            "run.name=kept",
            "run.max_steps=6",
            "run.checkpoint_every=2",
            "run.keep_checkpoints=1",
            "eval.every=2",
            "eval.max_prompts=8",
            "eval.keep_best=true",
            "eval.patience_metric=eval/reward_mean",
        ],
    )
    summary = Controller(config, console=io.StringIO()).run()
    run = Path(summary["run_dir"])
    kept = sorted(p.name for p in (run / "checkpoints").iterdir() if p.is_dir())
    best = summary["best"]["version"]
    assert kept == sorted({f"step-{v:06d}" for v in (best, 6) if v > 0}), kept
    assert (run / "hf").is_dir()
    if summary["model_version"] != summary["version"]:
        assert summary["model_version"] == best and (run / "hf-last").is_dir()
    else:
        assert not (run / "hf-last").exists()


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_architecture_checkpoints_resumes_and_exports(arch: str, tmp_path: Path) -> None:
    """What a run does with each architecture's learner, without the run: one gloo rank (the
    one-rank compute image) trains a step and saves a checkpoint; a fresh learner loads it
    (weights and AdamW state equal); ``export`` writes an HF directory that transformers loads
    with the trained weights in bf16, in the checkpoint format it reads (tied heads, fused
    Phi-3 tensors, MoE experts split again)."""
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from streamrl.checkpoint_layout import checkpoints_root
    from streamrl.config import to_yaml
    from streamrl.export import export_checkpoint
    from streamrl.models import load_causal_lm, resolve_model
    from streamrl.workers.learning import checkpoint
    from streamrl.workers.learning.fsdp import adamw, clip_and_step, shard_for_training
    from streamrl.workers.learning.learner import rendezvous

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = load_config(ROOT / "configs" / "tiny.yaml", [f"model.name={arch}"])
    (run_dir / "config.yaml").write_text(to_yaml(config))
    model_dir = resolve_model(arch)
    store = rendezvous("127.0.0.1:0", 0, 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        mesh = dist.device_mesh.init_device_mesh("cpu", (1,))

        def learner():
            model = shard_for_training(load_causal_lm(model_dir, "float32"), mesh, "bfloat16")
            return model, adamw(model.parameters(), 1e-2, (0.9, 0.99), 0.0, torch.device("cpu"))

        model, optimizer = learner()
        ids = torch.randint(4, 100, (2, 24), generator=torch.Generator().manual_seed(0))
        model(input_ids=ids, labels=ids).loss.backward()
        clip_and_step(model, optimizer, 1.0)
        checkpoint.save({"policy": (model, optimizer)}, checkpoints_root(run_dir), 1)
        params = dict(model.named_parameters())
        trained = {n: p.detach().clone() for n, p in params.items()}
        fresh, fresh_optimizer = learner()
        version, _ = checkpoint.load(
            {"policy": (fresh, fresh_optimizer)}, checkpoint.latest(checkpoints_root(run_dir))
        )
        assert version == 1
        for name, param in fresh.named_parameters():
            assert torch.equal(param, trained[name]), name
            saved = optimizer.state[params[name]]["exp_avg"]
            assert torch.equal(fresh_optimizer.state[param]["exp_avg"], saved), name
    finally:
        dist.destroy_process_group()
    assert export_checkpoint(run_dir, None, tmp_path / "hf") == 1
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.bfloat16)
    moved = 0
    for name, param in exported.named_parameters():
        assert torch.equal(param, trained[name].to(torch.bfloat16)), name
        moved += not torch.equal(param, load_causal_lm(model_dir).get_parameter(name))
    assert moved > 0


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
