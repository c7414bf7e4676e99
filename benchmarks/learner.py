"""Learner throughput: streamrl's training step against a plain PyTorch loop, one rank or two.

Both sides train the same model on the same synthetic batch (``--batch`` sequences of
``--prompt-tokens`` + ``--response-tokens``) in the same compute dtype with AdamW:

- ``plain``: ``model(ids).logits`` over every position, log-softmax, a policy-gradient loss on
  the response tokens, backward, AdamW step; no FSDP, no process group. Two variants when
  computing in bf16: weights held in bf16 (``plain bf16``), and fp32 master weights under
  ``torch.autocast`` (``plain amp``), which is what streamrl keeps (``model.learner_dtype``).
- ``streamrl``: ``workers.learning.train_step.TrainStep`` as the learner runs it, on FSDP2 ranks
  (gloo on CPU, NCCL on CUDA) or, with one rank, on its compute image
  (``workers/learning/fsdp.py``): logits only at response positions, global-denominator
  losses, one gradient reduce-scatter per update, the bf16 weight image in the forward.

With ``--spread`` response lengths vary (uniform in 1..``--response-tokens``): the plain
loop pads each micro-batch to its longest row, streamrl too unless ``--micro-batch-tokens``
sets its token budget (sorted by length, ``learner.micro_batch_tokens``).

Figures: tokens/s (prompt + response tokens trained per second, per rank; padding not
counted), and on CUDA the model FLOPs utilisation MFU = 6 * N * tokens/s / peak, with N the
parameter count (embedding included when tied) and the peak dense bf16 FLOP/s given by
``--peak-tflops`` (H100 SXM: 989). Run:

    python benchmarks/learner.py --model smollm2-135m-instruct --threads 2
    python benchmarks/learner.py --model random-llama-1b --device cuda --batch 32
    python benchmarks/learner.py --model tiny-random-llama --ranks 2
    python benchmarks/learner.py --prompt-tokens 64 --response-tokens 256 --spread \
        --micro-batch-tokens 2560
    python benchmarks/learner.py --threads 1 --adamw
    # the default job's step: 4 groups of 8 sharing 29-token prompts, 1-4 token answers
    python benchmarks/learner.py --threads 1 --batch 32 --group-size 8 --share-prompts \
        --prompt-tokens 29 --response-tokens 4 --spread --micro-batch 32 --steps 5

With ``--share-prompts`` streamrl encodes each group's prompt once, the plain loop once per
sequence (as a plain loop does); tokens/s counts the same nominal tokens for both.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import statistics
import time
from pathlib import Path

import torch

from streamrl.config import Config, load_config
from streamrl.hardware import cpu_description, resolve_compute_dtype
from streamrl.malloc import keep_freed_memory
from streamrl.models import load_causal_lm, resolve_model
from streamrl.protocol import Trajectory, TrajectoryGroup


def response_lengths(args: argparse.Namespace, seed: int) -> list[int]:
    """Each trajectory's response length: ``--response-tokens``, or with ``--spread`` drawn
    uniformly from 1 to it (responses that stop at their end token)."""
    rng = random.Random(seed)
    top = args.response_tokens
    return [rng.randint(1, top) if args.spread else top for _ in range(args.batch)]


def synthetic_groups(args: argparse.Namespace, vocab: int, seed: int) -> list[TrajectoryGroup]:
    """``args.batch`` trajectories in groups of ``--group-size``, random tokens, random
    rewards; with ``--share-prompts`` a group's trajectories share one prompt, as a group's
    samples do in a run (the learner then encodes it once: ``workers/learning/batching.py``)."""
    rng = random.Random(seed)
    lengths = iter(response_lengths(args, seed))
    groups = []
    for g in range(args.batch // args.group_size):
        trajectories = []
        for i in range(args.group_size):
            n = next(lengths)
            if i == 0 or not args.share_prompts:
                prompt = [rng.randrange(4, vocab) for _ in range(args.prompt_tokens)]
            trajectories.append(
                Trajectory.from_lists(
                    prompt,
                    [rng.randrange(4, vocab) for _ in range(n)],
                    [-2.0] * n,
                    [0] * n,
                    reward=rng.random(),
                    finish_reason="length",
                    generator_id=0,
                )
            )
        groups.append(TrajectoryGroup(f"g{g}", f"p{g}", trajectories, 0.0, 0.0))
    return groups


def bench_config(args: argparse.Namespace, ranks: int) -> Config:
    return load_config(
        None,
        [
            f"model.name={args.model}",
            f"model.compute_dtype={args.dtype}",
            f"learner.device={args.device}",
            f"learner.backend={'nccl' if args.device == 'cuda' else 'gloo'}",
            f"learner.count={ranks}",
            f"learner.groups_per_step={args.batch // args.group_size}",
            f"learner.micro_batch_size={args.micro_batch}",
            f"learner.micro_batch_tokens={args.micro_batch_tokens}",
            f"generator.max_new_tokens={args.response_tokens}",
            "learner.lr=1e-6",
        ],
    )


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_plain(args: argparse.Namespace, model_dir: Path, dtype: str, master: str) -> list[float]:
    """Seconds per step of the plain loop (same batch, compute dtype, micro-batches, AdamW):
    weights held in ``master``, computed in ``dtype`` (autocast when they differ)."""
    model = load_causal_lm(model_dir, master, args.device)
    model.config.use_cache = False
    fused = args.device == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=fused, foreach=not fused)
    autocast = torch.autocast(args.device, getattr(torch, dtype), enabled=master != dtype)
    vocab = model.config.vocab_size
    n, width = args.batch, args.prompt_tokens + args.response_tokens
    ids = torch.randint(4, vocab, (n, width), device=args.device)
    # Response tokens past each row's length are padding: masked out of the loss.
    lengths = torch.tensor(response_lengths(args, seed=0), device=args.device)
    mask = (torch.arange(args.response_tokens, device=args.device) < lengths[:, None]).float()
    advantages = torch.randn(n, 1, device=args.device)
    times = []
    for _ in range(args.steps + 1):
        _sync(args.device)
        start = time.perf_counter()
        for i in range(0, n, args.micro_batch):
            rows = slice(i, i + args.micro_batch)
            # As a plain loop pads: to the longest row of the micro-batch.
            chunk = ids[rows, : args.prompt_tokens + int(lengths[rows].max())]
            with autocast:
                logits = model(input_ids=chunk).logits[:, args.prompt_tokens - 1 : -1].float()
            logp = logits.log_softmax(-1).gather(-1, chunk[:, args.prompt_tokens :, None])[..., 0]
            weights = advantages[rows] * mask[rows, : logp.shape[1]]
            loss = -(logp * weights).sum() / mask.sum()
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(args.device)
        times.append(time.perf_counter() - start)
    return times[1:]  # the first step warms up allocators and kernels


def time_adamw(args: argparse.Namespace, model_dir: Path) -> dict[str, float]:
    """Seconds per AdamW step over the model's fp32 parameters (random gradients), fused and
    multi-tensor: the optimizer's share of a step (streamrl's learner uses the fused one)."""
    params = [
        p.detach().requires_grad_() for p in load_causal_lm(model_dir, "float32").parameters()
    ]
    for p in params:
        p.grad = torch.randn_like(p)
    out = {}
    for name, fused in (("fused", True), ("multi-tensor", False)):
        optimizer = torch.optim.AdamW(params, lr=1e-6, fused=fused, foreach=not fused)
        optimizer.step()  # allocates the state
        _sync(args.device)
        start = time.perf_counter()
        for _ in range(args.steps):
            optimizer.step()
        _sync(args.device)
        out[name] = (time.perf_counter() - start) / args.steps
    return out


def _streamrl_rank(rank: int, ranks: int, master: str, args: argparse.Namespace, out: str) -> None:
    import torch.distributed as dist

    from streamrl.workers.learning.learner import build_train_step, rendezvous

    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as every role process does (streamrl.controller.actors)
    device = torch.device(args.device, rank) if args.device == "cuda" else torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(
        backend, store=rendezvous(master, rank, ranks), rank=rank, world_size=ranks
    )
    config = bench_config(args, ranks)
    model_dir = resolve_model(args.model)
    step = build_train_step(config, model_dir, device, ranks)
    vocab = step.policy.config.vocab_size
    groups = synthetic_groups(args, vocab, seed=0)
    share = len(groups) // ranks
    times = []
    for version in range(args.steps + 1):
        _sync(args.device)
        start = time.perf_counter()
        step(groups[rank * share : (rank + 1) * share], version)
        _sync(args.device)
        times.append(time.perf_counter() - start)
    if args.profile and rank == 0:
        _profile(lambda: step(groups[:share], args.steps + 1), args.device)
    if rank == 0:
        Path(out).write_text(json.dumps(times[1:]))
    dist.destroy_process_group()


def _profile(fn, device: str) -> None:
    """One more step under torch.profiler: the ops that took the most time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as prof:
        fn()
        _sync(device)
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=18, max_name_column_width=48))
    # The same ops split by input shapes: which copies and products cost the most.
    by_shape = prof.key_averages(group_by_input_shape=True)
    print(by_shape.table(sort_by=key, row_limit=25, max_name_column_width=32))


def time_streamrl(args: argparse.Namespace, ranks: int) -> list[float]:
    from streamrl.transport import free_port

    out = Path(f"/tmp/streamrl-bench-learner-{time.time_ns()}.json")
    master = f"127.0.0.1:{free_port()}"
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_streamrl_rank, args=(r, ranks, master, args, str(out)))
        for r in range(ranks)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode != 0 for p in procs):
        raise SystemExit(f"streamrl learner ranks failed: exit codes {[p.exitcode for p in procs]}")
    times = json.loads(out.read_text())
    out.unlink()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=16, help="sequences per step")
    parser.add_argument("--group-size", type=int, default=4, help="sequences per group")
    parser.add_argument(
        "--share-prompts", action="store_true", help="a group's sequences share their prompt"
    )
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--response-tokens", type=int, default=64)
    parser.add_argument(
        "--spread", action="store_true", help="response lengths uniform in 1..--response-tokens"
    )
    parser.add_argument(
        "--micro-batch-tokens", type=int, default=0, help="streamrl's learner.micro_batch_tokens"
    )
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--ranks", default="1", help="comma list of rank counts, e.g. 1,2")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--profile", action="store_true", help="profile one streamrl step")
    parser.add_argument("--adamw", action="store_true", help="time AdamW alone, fused and not")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = resolve_compute_dtype(args.dtype, args.device)
    model_dir = resolve_model(args.model)
    params = sum(p.numel() for p in load_causal_lm(model_dir, "bfloat16").parameters())
    where = torch.cuda.get_device_name() if args.device == "cuda" else cpu_description()
    tokens = args.batch * args.prompt_tokens + sum(response_lengths(args, seed=0))
    responses = f"1..{args.response_tokens}" if args.spread else str(args.response_tokens)
    budget = f", streamrl micro-batch tokens {args.micro_batch_tokens}" * (
        args.micro_batch_tokens > 0
    )
    print(
        f"# learner bench: {args.model} ({params / 1e6:.0f}M params), {dtype}, {where}, "
        f"torch {torch.__version__}, threads {args.threads}, batch {args.batch} x "
        f"({args.prompt_tokens}+{responses}) tokens, micro-batch {args.micro_batch}{budget}, "
        f"{time.strftime('%Y-%m-%d')}"
    )
    if args.adamw:
        for name, seconds in time_adamw(args, model_dir).items():
            print(f"AdamW step, {name}: {seconds:.3f} s ({params / 1e6:.0f}M fp32 parameters)")
    rows = {"plain (1 process)": time_plain(args, model_dir, dtype, dtype)}
    if dtype != "float32":
        rows["plain amp (fp32 master)"] = time_plain(args, model_dir, dtype, "float32")
    for ranks in (int(r) for r in args.ranks.split(",")):
        rows[f"streamrl ({ranks} rank{'s' * (ranks > 1)})"] = time_streamrl(args, ranks)
    print(f"{'loop':<22} {'s/step':>8} {'tokens/s':>10} {'tok/s/rank':>11} {'MFU':>7}")
    results = {}
    plain_rate = None
    for name, times in rows.items():
        seconds = statistics.median(times)
        ranks = int(name.split("(")[1].split()[0]) if name.startswith("streamrl") else 1
        rate = tokens / seconds
        plain_rate = rate if name.startswith("plain") else plain_rate  # the fairest: the last
        mfu = 6 * params * rate / ranks / (args.peak_tflops * 1e12)
        mfu_text = f"{100 * mfu:6.1f}%" if args.device == "cuda" else "    n/a"
        print(f"{name:<22} {seconds:8.3f} {rate:10.1f} {rate / ranks:11.1f} {mfu_text}")
        results[name] = {"s_per_step": seconds, "tokens_per_s": rate, "mfu": mfu, "ranks": ranks}
    for name, r in results.items():
        if not name.startswith("plain"):
            per_rank = r["tokens_per_s"] / r["ranks"]
            print(f"{name}: {per_rank / plain_rate:.2f}x the plain loop per rank")
    print("MFU = 6 * params * tokens/s per rank / peak; peak", args.peak_tflops, "TFLOP/s")
    if args.json:
        args.json.write_text(json.dumps({"device": where, "dtype": dtype, "results": results}))


if __name__ == "__main__":
    main()
