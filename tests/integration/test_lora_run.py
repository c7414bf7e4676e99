"""A LoRA run end to end on the tiny random Llama: two FSDP2 learner ranks train adapters over a
frozen base, the stream carries only the adapters, two generators merge them (every image
verified bitwise), the checkpoint holds adapters and their optimizer state only, a resume
goes on from it, and ``streamrl export`` writes the adapter or, with ``--merge``, the
merged model."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from streamrl.config import load_config
from streamrl.controller.run import Controller
from streamrl.models import load_causal_lm, resolve_model
from streamrl.models.lora import ADAPTER_FILE

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
LORA = "model.lora={r: 4, alpha: 8, target_modules: [q_proj, v_proj, down_proj]}"


def _launch(out: Path, *overrides: str) -> dict:
    config = load_config(
        ROOT / "configs" / "tiny.yaml",
        [
            f"run.output_dir={out}",
            "run.name=lora",
            "run.checkpoint_every=2",
            "weights.verify_every=1",
            "eval.every=0",
            "eval.before_train=false",
            LORA,
            *overrides,
        ],
    )
    return Controller(config, console=io.StringIO()).run()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    summary = _launch(out, "run.max_steps=4")
    assert summary["version"] == 4
    return Path(summary["run_dir"])


def _records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "step" in r]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamrl.cli", *args], capture_output=True, text=True, cwd=ROOT
    )


def test_only_adapters_train_and_stream(run_dir: Path) -> None:
    init = load_file(str(run_dir / "adapter-init" / ADAPTER_FILE))
    # 2 layers x 3 targets x (A, B): the image every role holds.
    assert len(init) == 12
    adapter_bytes = sum(t.numel() * 2 for t in init.values())
    records = [r for r in _records(run_dir) if "weights/bytes_full" in r]
    assert records  # rank 0's shard: half of every adapter's rows
    assert all(r["weights/bytes_full"] == adapter_bytes / 2 for r in records)
    assert sum(r["weights/images_verified"] for r in records) > 0
    assert all(r.get("weights/image_mismatches", 0) == 0 for r in records)
    final = load_file(str(run_dir / "adapter" / ADAPTER_FILE))
    assert final.keys() == init.keys()
    moved = [n for n in final if not torch.equal(final[n], init[n])]
    assert any(".lora_B." in n for n in moved)  # B left zero: the adapters learned


def test_checkpoints_hold_adapters_and_their_optimizer_only(run_dir: Path) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    keys = list(
        FileSystemReader(str(run_dir / "checkpoints" / "step-000004"))
        .read_metadata()
        .state_dict_metadata
    )
    model_keys = [k for k in keys if k.startswith("policy.model.")]
    assert model_keys and all(".lora_" in k for k in model_keys)
    assert any(k.startswith("policy.optim.state.") and ".lora_" in k for k in keys)
    assert not any("base_layer" in k for k in keys)


def test_export_adapter_and_merged(run_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel

    assert _cli("export", str(run_dir), "--out", str(tmp_path / "adapter")).returncode == 0
    done = _cli("export", str(run_dir), "--merge", "--out", str(tmp_path / "merged"))
    assert done.returncode == 0, done.stderr
    # The exported adapter is the run's final one, and loads with peft onto the base.
    exported = load_file(str(tmp_path / "adapter" / ADAPTER_FILE))
    final = load_file(str(run_dir / "adapter" / ADAPTER_FILE))
    assert exported.keys() == final.keys()
    assert all(torch.equal(exported[n], final[n]) for n in final)
    base = resolve_model("tiny-random-llama")
    peft_model = PeftModel.from_pretrained(load_causal_lm(base, "float32"), tmp_path / "adapter")
    merged = load_causal_lm(tmp_path / "merged")
    ids = torch.tensor([[1, 20, 30, 40, 50]])
    with torch.no_grad():
        torch.testing.assert_close(
            peft_model(input_ids=ids).logits,
            merged(input_ids=ids).logits.float(),
            atol=0.05,
            rtol=0.05,
        )
    # --merge equals the run's own merged export (what its generators held at the end).
    mine = load_file(str(run_dir / "hf" / "model.safetensors"))
    theirs = load_file(str(tmp_path / "merged" / "model.safetensors"))
    assert all(torch.equal(mine[n], theirs[n]) for n in mine)


def test_resume_goes_on_from_the_adapters(run_dir: Path) -> None:
    before = load_file(str(run_dir / "adapter" / ADAPTER_FILE))
    summary = _launch(run_dir.parent, "run.max_steps=6", "run.resume=true")
    assert summary["version"] == 6
    records = _records(run_dir)
    assert [r["step"] for r in records][-2:] == [5, 6]
    after = load_file(str(run_dir / "adapter" / ADAPTER_FILE))
    assert any(not torch.equal(after[n], before[n]) for n in before)


def test_full_weights_export_refuses_merge(tmp_path: Path) -> None:
    done = _cli("export", str(ROOT / "no-such-run"), "--merge", "--out", str(tmp_path / "x"))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1


def test_a_lora_run_replays_bitwise_from_a_checkpoint(run_dir: Path) -> None:
    """Adapters only, started from the step-2 checkpoint (its optimizer state): every later
    step (the resume test above may have added some) retrains to the run's exact adapters."""
    from support import replay_cli

    result = replay_cli(run_dir, "--from-checkpoint", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"steps 3-\d+ bitwise equal to the run", result.stdout), result.stdout
