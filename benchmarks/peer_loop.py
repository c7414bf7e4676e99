"""The comparison users make: a minimal single-process synchronous GRPO loop, against streamrl.

Written here with transformers and torch only (the prompts and the reward are streamrl's, so
the task is identical): per step, ``model.generate`` samples ``group_size`` responses for each
prompt at temperature 1, they are scored, groups whose rewards are all equal are dropped and
more are generated until ``groups_per_step`` remain (DAPO dynamic sampling, as the default job
does), then one policy-gradient update (GRPO advantages, token-mean loss, AdamW, clip 1.0).
Same model, task, batch shape and compute dtype as the config (``model.compute_dtype``: bf16
autocast over fp32 masters, as streamrl's learner keeps them); one process on every core.

Figures: trained samples/s over the steps after ``--warmup``, and the share of time spent
generating. With ``--compare results.json`` (from ``streamrl bench throughput``) it prints
streamrl's sync and async samples/s beside it.

    python benchmarks/peer_loop.py --steps 12 --warmup 2
    python benchmarks/peer_loop.py --compare runs/bench-throughput/results.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from streamrl.bench.report import mode_label
from streamrl.config import default_config_path, load_config
from streamrl.data import prompt_source
from streamrl.hardware import cpu_description, resolve_compute_dtype
from streamrl.models import load_causal_lm, load_tokenizer, resolve_model
from streamrl.rewards import CombinedReward, RewardInput


def sample_groups(model, tokenizer, prompts, config, dtype) -> list[tuple]:
    """(prompt ids, response ids, rewards) per prompt: ``group_size`` samples each."""
    gen = config.generator
    texts = [
        tokenizer.apply_chat_template(p.messages, tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=gen.temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=gen.max_new_tokens,
            num_return_sequences=gen.group_size,
            pad_token_id=tokenizer.pad_token_id,
        )
    reward = CombinedReward(config.rewards)
    start = enc.input_ids.shape[1]
    groups = []
    for i, prompt in enumerate(prompts):
        prompt_ids = enc.input_ids[i][enc.attention_mask[i].bool()].tolist()
        responses, rewards = [], []
        for row in out[i * gen.group_size : (i + 1) * gen.group_size]:
            ids = row[start:].tolist()
            if tokenizer.eos_token_id in ids:  # keep the stop token, drop the padding
                ids = ids[: ids.index(tokenizer.eos_token_id) + 1]
            text = tokenizer.decode(ids, skip_special_tokens=True)
            responses.append(ids)
            rewards.append(reward(RewardInput(text, ids, prompt.ground_truth)))
        groups.append((prompt_ids, responses, rewards))
    return groups


def train_step(model, optimizer, groups, dtype, grad_clip: float) -> None:
    """One GRPO update over every sample: right-padded sequences, loss on response tokens."""
    rows, masks, advantages = [], [], []
    for prompt_ids, responses, rewards in groups:
        r = torch.tensor(rewards)
        adv = (r - r.mean()) / (r.std() + 1e-6)
        for ids, a in zip(responses, adv, strict=True):
            rows.append(prompt_ids + ids)
            masks.append([0] * len(prompt_ids) + [1] * len(ids))
            advantages.append(float(a))
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float32)
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        logits = model(ids).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    mask = mask[:, 1:]
    adv = torch.tensor(advantages)[:, None]
    loss = -(adv * logp * mask).sum() / mask.sum()  # on-policy: the ratio is 1
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=default_config_path())
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--compare", type=Path, help="streamrl bench throughput results.json")
    args = parser.parse_args()
    config = load_config(args.config, [])
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model_dir = resolve_model(config.model.name)
    tokenizer = load_tokenizer(model_dir)
    tokenizer.padding_side = "left"
    model = load_causal_lm(model_dir, "float32")
    dtype = getattr(torch, resolve_compute_dtype(config.model.compute_dtype, "cpu"))
    lc, gen = config.learner, config.generator
    optimizer = torch.optim.AdamW(model.parameters(), lr=lc.lr, betas=lc.betas, foreach=True)
    prompts = prompt_source(config.data, config.run.seed)
    keep_equal = not config.buffer.drop_zero_variance
    marks, gen_s = [], 0.0
    for _step in range(args.warmup + args.steps):
        batch: list[tuple] = []
        while len(batch) < lc.groups_per_step:
            start = time.perf_counter()
            chosen = [next(prompts) for _ in range(gen.prompts_per_call)]
            for group in sample_groups(model, tokenizer, chosen, config, dtype):
                if keep_equal or len(set(group[2])) > 1:
                    batch.append(group)
            gen_s += time.perf_counter() - start
        train_step(model, optimizer, batch[: lc.groups_per_step], dtype, lc.grad_clip)
        marks.append((time.perf_counter(), gen_s))
    (t0, g0), (t1, g1) = marks[args.warmup - 1], marks[-1]
    samples_per_s = args.steps * lc.groups_per_step * gen.group_size / (t1 - t0)
    print(
        f"# peer loop: {args.config}; {cpu_description()}; {args.threads} threads; compute "
        f"{str(dtype).removeprefix('torch.')}; torch {torch.__version__}"
    )
    print(
        f"single-process loop: {samples_per_s:.2f} trained samples/s over {args.steps} steps "
        f"({(t1 - t0) / args.steps:.1f} s/step, {100 * (g1 - g0) / (t1 - t0):.0f}% generating)"
    )
    if args.compare:
        report = json.loads(args.compare.read_text())
        for r in report["results"]:
            print(
                f"streamrl {mode_label(r)}: {r['samples_per_s']:.2f} trained samples/s "
                f"({r['samples_per_s'] / samples_per_s:.2f}x the single-process loop)"
            )


if __name__ == "__main__":
    main()
