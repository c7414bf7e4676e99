"""Does a static KV cache or ``torch.compile`` pay for CPU decoding? One decode step of the
default model, timed three ways at each batch size on the same threads:

- eager, ``DynamicCache`` (what the HF engine runs, less its prepacked linears);
- eager, ``StaticCache`` (preallocated key/value buffers: no concatenation per step);
- ``torch.compile`` of the decode forward over a ``StaticCache`` (fixed shapes, so one
  compilation per batch size; its compile time is printed too).

Greedy decoding of ``--new-tokens`` after a ``--prompt-tokens`` prefill; the first
``WARMUP_STEPS`` steps of each run are left out of the mean step time.

    python benchmarks/decode_compile.py --batches 1,16 --threads 2
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from streamrl.hardware import cpu_description
from streamrl.malloc import keep_freed_memory
from streamrl.models import SMOLLM2, load_causal_lm, resolve_model

WARMUP_STEPS = 8


def decode_steps(model, cache, batch: int, prompt: int, new: int, step: Callable) -> list[float]:
    """Prefill ``batch`` random prompts, then time each of ``new`` greedy decode steps."""
    ids = torch.randint(100, 1000, (batch, prompt))
    positions = torch.arange(prompt)
    out = model(
        input_ids=ids,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
        cache_position=positions,
        position_ids=positions.expand(batch, prompt),
    )
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    times = []
    for i in range(new):
        start = time.perf_counter()
        token = step(token, torch.tensor([prompt + i]), cache)[:, -1].argmax(-1, keepdim=True)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    from transformers import DynamicCache, StaticCache

    keep_freed_memory()
    torch.set_num_threads(args.threads)
    model = load_causal_lm(resolve_model(SMOLLM2), "bfloat16").eval()
    prompt, new = args.prompt_tokens, args.new_tokens
    print(f"{cpu_description()}; {args.threads} threads; bf16; prompt {prompt} + {new} tokens")

    def step(token: torch.Tensor, position: torch.Tensor, cache) -> torch.Tensor:
        rows = token.shape[0]
        return model(
            input_ids=token,
            past_key_values=cache,
            use_cache=True,
            cache_position=position,
            position_ids=position.view(1, 1).expand(rows, 1),
        ).logits

    compiled = torch.compile(step, dynamic=False)
    header = ("batch", 5), ("dynamic ms", 11), ("static ms", 10), ("compiled ms", 12)
    print(" ".join(f"{name:>{width}}" for name, width in (*header, ("compile s", 10))))
    with torch.no_grad():
        for batch in (int(b) for b in args.batches.split(",")):

            def static():
                return StaticCache(config=model.config, max_cache_len=prompt + new)

            def mean_ms(make_cache, fn, rows: int, runs: int = 2) -> float:
                for _ in range(runs):
                    times = decode_steps(model, make_cache(), rows, prompt, new, fn)
                return sum(times[WARMUP_STEPS:]) / len(times[WARMUP_STEPS:]) * 1e3

            dynamic_ms = mean_ms(lambda: DynamicCache(config=model.config), step, batch)
            static_ms = mean_ms(static, step, batch)
            start = time.perf_counter()
            decode_steps(model, static(), batch, prompt, 1, compiled)  # compiles
            compile_s = time.perf_counter() - start
            compiled_ms = mean_ms(static, compiled, batch)
            print(
                f"{batch:>5} {dynamic_ms:>11.1f} {static_ms:>10.1f} {compiled_ms:>12.1f} "
                f"{compile_s:>10.1f}"
            )


if __name__ == "__main__":
    main()
