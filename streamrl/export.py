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

import shutil
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


def export_checkpoint(run_dir: Path, step: int | None, out: Path, merge: bool = False) -> int:
    """Write the policy of checkpoint ``step`` as an HF directory ``out``; returns its version.
    A LoRA run's policy is written as its PEFT adapter, or with ``merge`` as the base model
    with the adapters merged in (bf16, as the generators ran it)."""
    import torch
    import torch.distributed.checkpoint as dcp

    from streamrl.models import load_causal_lm, load_tokenizer, resolve_model
    from streamrl.models.lora import (
        adapter_settings,
        attach_adapter,
        initial_adapter_dir,
        uses_lora,
    )

    if not (run_dir / "config.yaml").is_file():
        raise ExportError(f"{run_dir}: not a run directory (no config.yaml)")
    path = checkpoint_dir(run_dir, step)
    try:
        config = load_config(run_dir / "config.yaml")
    except ConfigError as exc:
        raise ExportError(f"{run_dir}/config.yaml: {exc}") from None
    base = resolve_model(
        config.model.name,
        revision=config.model.revision,
        tiny_hidden=config.model.tiny_hidden,
        tiny_layers=config.model.tiny_layers,
    )
    if uses_lora(config):
        adapter_dir = initial_adapter_dir(run_dir)
        model = load_causal_lm(base, "bfloat16")
        model = attach_adapter(model, adapter_dir, adapter_settings(config), trainable=True)
        trained = {n: p.data for n, p in model.named_parameters() if p.requires_grad}
        dcp.load({"policy": {"model": trained}}, checkpoint_id=str(path), no_dist=True)
        trained = {n: t.to(torch.bfloat16) for n, t in trained.items()}
        if merge:
            write_merged(trained, base, adapter_dir, out)
        else:
            write_adapter(trained, adapter_dir, base, out)
        return checkpoint_layout.read_meta(path)[0]
    if merge:
        raise ExportError(f"{run_dir}: --merge is for LoRA runs; this run trained every weight")
    model = load_causal_lm(base, config.model.learner_dtype)
    state = {"policy": {"model": model.state_dict()}}
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    model.load_state_dict(state["policy"]["model"])
    model.config.use_cache = True
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    load_tokenizer(base).save_pretrained(out)
    return checkpoint_layout.read_meta(path)[0]


def keep_best_version(run_dir: Path, version: int) -> None:
    """``eval.keep_best`` at the end of a run whose best evaluation was not its last: the last
    version's model moves to ``hf-last/`` (a LoRA run's adapter to ``adapter-last/``), and
    ``hf/`` (``adapter/``) get version ``version``'s, from its checkpoint. Raises
    ``ExportError`` (the last version's model then stays where it was) when that checkpoint
    cannot be read."""
    from streamrl.models.lora import uses_lora

    config = load_config(run_dir / "config.yaml")
    lora = uses_lora(config)
    checkpoint_dir(run_dir, version)  # refused before anything moves
    moved = [("hf", "hf-last"), *([("adapter", "adapter-last")] if lora else [])]
    for name, last in moved:
        if (run_dir / name).exists():
            (run_dir / name).rename(run_dir / last)
    try:
        export_checkpoint(run_dir, version, run_dir / "hf", merge=lora)
        if lora:
            export_checkpoint(run_dir, version, run_dir / "adapter")
    except Exception:
        for name, last in moved:  # put the last version's model back
            shutil.rmtree(run_dir / name, ignore_errors=True)
            if (run_dir / last).exists():
                (run_dir / last).rename(run_dir / name)
        raise


def write_adapter(trained: dict, adapter_dir: Path, base: Path, out: Path) -> None:
    """A PEFT adapter directory: ``trained`` (peft parameter names -> bf16) under the adapter
    file's names, the run's adapter_config.json, and the base model's tokenizer."""
    from safetensors.torch import save_file

    from streamrl.models import load_tokenizer
    from streamrl.models.lora import ADAPTER_FILE, wire_name

    out.mkdir(parents=True, exist_ok=True)
    tensors = {wire_name(n): t.contiguous() for n, t in trained.items()}
    save_file(tensors, str(out / ADAPTER_FILE))
    shutil.copyfile(adapter_dir / "adapter_config.json", out / "adapter_config.json")
    load_tokenizer(base).save_pretrained(out)


def write_merged(trained: dict, base: Path, adapter_dir: Path, out: Path) -> None:
    """The base model with ``trained`` merged in, in bf16, exactly as every generator merges
    it (``streamrl.models.lora.LoraMerge``), loadable with
    ``AutoModelForCausalLM.from_pretrained``."""
    import torch

    from streamrl.models import load_causal_lm, load_tokenizer
    from streamrl.models.lora import LoraMerge, saved_settings, wire_name

    adapters = {wire_name(n): t for n, t in trained.items()}
    merged = dict(LoraMerge(base, adapters, saved_settings(adapter_dir)).merged(adapters))
    model = load_causal_lm(base, "bfloat16")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, weight in merged.items():
            params[name].copy_(weight)
    model.config.use_cache = True
    model.save_pretrained(out, safe_serialization=True)
    load_tokenizer(base).save_pretrained(out)


def save_adapter_and_merged(trained: dict, base: Path, adapter_dir: Path, out: Path) -> None:
    """The end of a LoRA run: its adapter in ``<run>/adapter`` and the merged model in
    ``out`` (``<run>/hf``, which evaluation reads)."""
    write_adapter(trained, adapter_dir, base, out.parent / "adapter")
    write_merged(trained, base, adapter_dir, out)
