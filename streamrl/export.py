"""``streamrl export``: a saved learner checkpoint -> a Hugging Face model directory.

A checkpoint (``streamrl.checkpoint_layout``: torch.distributed.checkpoint files, sharded per
rank) holds the policy's fp32 masters. Export reads only the policy's weights, in one
process (no process group), into the run's base model architecture, and writes bf16
safetensors (the image the generators ran) with the base model's tokenizer, loadable with
``AutoModelForCausalLM.from_pretrained``.

Example: ``export_checkpoint(Path("runs/r"), step=None, out=Path("out"))`` exports the newest
checkpoint and returns its version.
"""

from __future__ import annotations

from pathlib import Path

from streamrl import checkpoint_layout
from streamrl.config import ConfigError, load_config


class ExportError(ValueError):
    """A run or checkpoint that cannot be exported; the message is one line."""


def checkpoint_dir(run_dir: Path, step: int | None) -> Path:
    """The checkpoint of version ``step`` (default: the newest) in ``run_dir``."""
    root = checkpoint_layout.checkpoints_root(run_dir)
    if step is None:
        path = checkpoint_layout.latest(root)
        if path is None:
            raise ExportError(f"{run_dir}: no checkpoint (is it a streamrl run directory?)")
        return path
    path = checkpoint_layout.path_for(root, step)
    if not checkpoint_layout.is_complete(path):
        have = [p.name for p in checkpoint_layout.complete_checkpoints(root)]
        raise ExportError(f"{run_dir}: no checkpoint for step {step} (have: {', '.join(have)})")
    return path


def export_checkpoint(run_dir: Path, step: int | None, out: Path) -> int:
    """Write the policy of checkpoint ``step`` as an HF directory ``out``; returns its version."""
    import torch
    import torch.distributed.checkpoint as dcp

    from streamrl.models import load_causal_lm, load_tokenizer, resolve_model

    if not (run_dir / "config.yaml").is_file():
        raise ExportError(f"{run_dir}: not a run directory (no config.yaml)")
    path = checkpoint_dir(run_dir, step)
    try:
        config = load_config(run_dir / "config.yaml")
    except ConfigError as exc:
        raise ExportError(f"{run_dir}/config.yaml: {exc}") from None
    base = resolve_model(
        config.model.name,
        tiny_hidden=config.model.tiny_hidden,
        tiny_layers=config.model.tiny_layers,
    )
    model = load_causal_lm(base, config.model.learner_dtype)
    state = {"policy": {"model": model.state_dict()}}
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    model.load_state_dict(state["policy"]["model"])
    model.config.use_cache = True
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    load_tokenizer(base).save_pretrained(out)
    return checkpoint_layout.read_meta(path)[0]
