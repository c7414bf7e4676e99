"""LoRA against full fine-tuning on the learner: step time, peak memory, weight bytes per update.

Each mode runs in a fresh process (so its peak memory is its own) with one learner rank (gloo on
CPU, NCCL on CUDA) building ``workers.learning.train_step.TrainStep`` exactly as the learner does
(``build_train_step``; LoRA: version 0 of the adapters written by ``streamrl.models.lora``), on the
default job's step shape by default: 4 groups of 8 sharing 29-token prompts, 1-4 token answers, one
micro-batch (``benchmarks/learner.py`` makes the synthetic groups). Each step is followed by what
the weight publisher does: a bf16 snapshot of the trained parameters and its diff against the
previous one (``workers.learning.publisher``), whose encoded size is the bytes a generator receives
per update. For LoRA, the generator's merge of a whole adapter version into full weights
(``streamrl.models.lora.LoraMerge``) is timed too.

Figures: step time (median of ``--steps`` after one warm-up), peak RSS of the process (CPU)
or peak CUDA memory allocated, trained parameters, bytes per update (median), merge time.

    python benchmarks/lora.py --threads 1
    python benchmarks/lora.py --model gemma-3-270m --threads 1
    python benchmarks/lora.py --model random-smollm2-135m --device cuda --batch 64 \
        --prompt-tokens 256 --response-tokens 256 --micro-batch 32
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch

from streamrl.config import load_config
from streamrl.hardware import cpu_description, resolve_compute_dtype

HERE = Path(__file__).resolve().parent


def _learner_bench():
    """benchmarks/learner.py as a module (benchmarks/ is no package)."""
    spec = importlib.util.spec_from_file_location("learner_bench", HERE / "learner.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _config(args: argparse.Namespace, lora: bool, out: Path):
    overrides = [
        f"model.name={args.model}",
        f"model.compute_dtype={args.dtype}",
        f"learner.device={args.device}",
        f"learner.backend={'nccl' if args.device == 'cuda' else 'gloo'}",
        f"learner.groups_per_step={args.batch // args.group_size}",
        f"learner.micro_batch_size={args.micro_batch}",
        "learner.share_prompts=true",
        f"run.output_dir={out}",
    ]
    if lora:
        overrides.append(f"model.lora={{r: {args.r}, alpha: {2 * args.r}}}")
    return load_config(None, overrides)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _mode(lora: bool, args: argparse.Namespace, out: str) -> None:
    import torch.distributed as dist

    from streamrl.malloc import keep_freed_memory
    from streamrl.models import resolve_model
    from streamrl.models.lora import (
        LoraMerge,
        adapter_settings,
        load_adapter_image,
        write_initial_adapter,
    )
    from streamrl.transport import free_port
    from streamrl.workers.learning.learner import build_train_step, rendezvous
    from streamrl.workers.learning.shard_image import encode_shard, local_bf16_shards

    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as every role process does
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if args.device == "cuda" else "gloo"
    store = rendezvous(f"127.0.0.1:{free_port()}", 0, 1)
    dist.init_process_group(backend, store=store, rank=0, world_size=1)
    model_dir = resolve_model(args.model)
    work = Path(tempfile.mkdtemp(prefix="streamrl-bench-lora-"))
    config = _config(args, lora, work)
    adapter_dir = write_initial_adapter(config, model_dir, work) if lora else None
    step = build_train_step(config, model_dir, device, 1, adapter_dir=adapter_dir)
    groups = _learner_bench().synthetic_groups(args, step.policy.config.vocab_size, seed=0)
    trained = sum(p.numel() for p in step.policy.parameters() if p.requires_grad)
    previous = local_bf16_shards(step.policy, 0)
    times, sent = [], []
    for version in range(args.steps + 1):
        _sync(args.device)
        start = time.perf_counter()
        step(groups, version)
        _sync(args.device)
        times.append(time.perf_counter() - start)
        image = local_bf16_shards(step.policy, 0)
        parts = encode_shard(image, previous, chunk_bytes=1 << 22, dense_threshold=0.5)
        sent.append(sum(memoryview(p.values).nbytes + memoryview(p.indices).nbytes for p in parts))
        previous = image
    merge_s = None
    if lora:
        adapters = load_adapter_image(adapter_dir)
        merge = LoraMerge(model_dir, adapters, adapter_settings(config))
        start = time.perf_counter()
        merge.merged(adapters)
        merge_s = time.perf_counter() - start
    if args.device == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**30
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    result = {
        "mode": f"lora r={args.r}" if lora else "full",
        "trained_params": trained,
        "step_s": statistics.median(times[1:]),
        "step_s_all": times[1:],
        "peak_gib": peak,
        "bytes_per_update": statistics.median(sent[1:]),
        "merge_s": merge_s,
    }
    Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def run_mode(lora: bool, args: argparse.Namespace) -> dict:
    out = Path(tempfile.mktemp(prefix="streamrl-bench-lora-", suffix=".json"))
    proc = mp.get_context("spawn").Process(target=_mode, args=(lora, args, str(out)))
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        raise SystemExit(f"{'lora' if lora else 'full'} run failed: exit code {proc.exitcode}")
    result = json.loads(out.read_text())
    out.unlink()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--r", type=int, default=16, help="LoRA rank (alpha = 2 r)")
    parser.add_argument("--batch", type=int, default=32, help="sequences per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=29)
    parser.add_argument("--response-tokens", type=int, default=4)
    parser.add_argument("--no-spread", dest="spread", action="store_false")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--modes", default="full,lora")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.share_prompts = True
    args.micro_batch_tokens = 0
    dtype = resolve_compute_dtype(args.dtype, args.device)
    where = (
        torch.cuda.get_device_name(0)
        if args.device == "cuda"
        else f"{cpu_description()}, {args.threads} thread(s)"
    )
    print(f"{args.model}, compute {dtype}, {where}")
    print(
        f"step: {args.batch // args.group_size} groups of {args.group_size}, prompts "
        f"{args.prompt_tokens} tokens, responses 1..{args.response_tokens}"
    )
    results = [run_mode(mode == "lora", args) for mode in args.modes.split(",")]
    memory = "peak CUDA GiB" if args.device == "cuda" else "peak RSS GiB"
    print(f"| mode | trained params | step s | {memory} | bytes/update | merge s |")
    print("|---|---|---|---|---|---|")
    for r in results:
        merge = "-" if r["merge_s"] is None else f"{r['merge_s']:.3f}"
        print(
            f"| {r['mode']} | {r['trained_params'] / 1e6:.2f}M | {r['step_s']:.3f} | "
            f"{r['peak_gib']:.2f} | {r['bytes_per_update'] / 2**20:.2f} MiB | {merge} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"where": where, "dtype": dtype, "results": results}))


if __name__ == "__main__":
    main()
