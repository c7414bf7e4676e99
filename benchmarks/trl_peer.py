"""The peer users would pick: Hugging Face TRL's ``GRPOTrainer`` on a streamrl job's recipe.

Runs in its own venv (TRL is no dependency of streamrl)::

    ./scripts/trl_venv.sh                                       # once: makes .venv-trl
    .venv-trl/bin/python benchmarks/trl_peer.py --out runs/trl-peer   # the default job
    .venv-trl/bin/python benchmarks/trl_peer.py --config configs/default.yaml --seed 1 \\
        --out runs/trl-peer-1 run.max_steps=30 eval.every=5

``streamrl bench quality --peer trl`` runs it once per seed and reads ``DIR/result.json``::

    {"wall_s", "steps", "curve": [{"samples", "seconds", "exact", "completed", "reward_mean"}],
     "train_reward": [[samples, mean raw reward], ...], "cpu", "capability", "trl_version",
     "notes": [...], ...}

``samples`` are trained samples so far (steps x ``learner.groups_per_step`` x
``generator.group_size``); ``seconds`` count from the start of training: loading the model and
building the trainer are left out (``setup_s`` says how long they took), the held-out evals
(one before training, one every ``eval.every`` steps and one at the end) are in (``eval_s``).

What is the same as streamrl's recipe: the model (``model.name`` resolved by streamrl, fp32
master weights); the training prompts (the seeded stream ``PromptStream(data, run.seed)``,
prompts 0, 1, 2, ... in order, through the same chat template); the rewards (the config's
``rewards:`` through streamrl's ``CombinedReward``, on the response decoded as streamrl's
generator decodes it, with its finish reason: "stop" if it ended on a stop token);
``generator.group_size`` samples per prompt, ``learner.groups_per_step`` prompts per step,
``generator.max_new_tokens``/``temperature``/``top_p``/``top_k``, the stop tokens
(``streamrl.models.stop_token_ids``); AdamW (fused: TRL's default ``adamw_torch_fused``, as
streamrl's) with ``learner.lr``/``betas``/``weight_decay``, the gradient clip, linear warmup;
the KL coefficient (``algorithm.kl.coef``, k3 as streamrl's
default), the PPO clip range, the entropy coefficient, GRPO's group advantage, the loss
aggregation (``token-mean``, streamrl's default, is TRL's ``dapo``: one mean over every
response token of the step); the compute dtype (bf16 autocast where
``streamrl.hardware.resolve_compute_dtype`` picks bf16, else fp32), 2 torch threads, no
gradient checkpointing, ``run.max_steps`` optimizer steps; and the held-out eval:
``streamrl.evaluation.eval_prompts`` decoded greedily by the model being trained (HF
``generate``, ``eval.max_new_tokens``, the same stop tokens), scored by
``streamrl.evaluation.score``.

``compute_dtypes`` in the result says what generation and training computed in (probed on
the first decoder block).

What differs (also written to ``notes`` in the result):

- Synchronous: each step generates its batch with the current weights (HF ``generate``, the
  whole batch padded together), then trains on it; nothing overlaps. streamrl's async mode
  overlaps generation with the learner (``buffer.max_staleness``) and corrects for the lag
  (``algorithm.correction``); TRL needs no correction and has none on this path (its
  importance-sampling correction is for vLLM generation only).
- No dynamic-sampling refill: a group whose rewards are all equal (zero variance) gets advantage
  0 and is trained on, its tokens still counted in the token mean, where streamrl's
  ``buffer.drop_zero_variance`` drops it and trains on another group instead; so a TRL step
  carries fewer informative groups. Prompts are consumed strictly ``groups_per_step`` per
  step, while streamrl's stream moves on past dropped groups.
- The learning-rate schedule is transformers' ``cosine_warmup_with_min_lr`` (``min_lr_rate`` =
  ``learner.min_lr_ratio``; ``1.0`` gives ``constant``): the warmup is streamrl's
  ((step + 1) / warmup_steps), the cosine decay runs one step ahead of streamrl's (TRL's step i
  has streamrl's step i + 1 rate; the last step has exactly the min rate).
- Cost per sample (what the equal-time comparison measures, not a recipe difference): TRL
  prefills each prompt once per sample (the sampler repeats it ``group_size`` times) and, on a
  CPU, its fused log-prob head scores every position, prompt tokens included; streamrl's
  learner encodes a group's shared prompt once (``learner.share_prompts``).
- Advantage: (r - mean) / (std + 1e-4) per group (TRL), against std + 1e-6 (streamrl); both
  use the unbiased std. ``dr_grpo`` maps to ``scale_rewards="none"``; ``rloo`` and ``gae`` have
  no GRPOTrainer equivalent and are refused.
- Weight decay (0 in the default job) is applied by the HF Trainer to weights other than
  biases and norms only; streamrl's AdamW decays every parameter.
- The loss aggregation ``seq-mean-token-sum-norm`` maps to TRL's ``dr_grpo`` (sum over tokens /
  (responses x max_new_tokens)); ``seq-mean-token-sum`` has no TRL equivalent and is refused.
- bf16: TRL autocasts fp32 weights to bf16 (accelerate's mixed precision); streamrl's learner
  runs the forward on a bf16 image of the fp32 masters. Generation uses the same model as
  training here; streamrl's generator holds its own bf16 copy.
- No off-policy guidance (``algorithm.guidance``: a reference response in place of a sample
  in a group that found nothing as good); GRPOTrainer trains every group as sampled.
- Prompts longer than ``data.max_prompt_tokens`` are kept whole by TRL (streamrl cuts them to
  the last ``max_prompt_tokens`` tokens); a note says how many there were (none in the
  arithmetic jobs).
- Refused (no GRPOTrainer equivalent): ``algorithm.overlong_buffer``, ``algorithm.kl.kind``
  other than k3, ``kl.in_reward``, ``kl.adaptive_target``, ``learner.mini_batches`` or
  ``ppo_epochs`` > 1. Without effect here: ``algorithm.dual_clip``, ``correction``, ``is_cap``
  and ``proximal`` (one on-policy update per batch: the ratio is 1), and streamrl's own
  machinery (``buffer.*``, ``generator.count``/``prompts_per_call``, ``placement.*``, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from streamrl.config import Config, ConfigError, default_config_path, load_config

STARTED = time.time()

# streamrl's algorithm.loss_agg -> TRL's loss_type (module doc).
LOSS_TYPES = {
    "token-mean": "dapo",
    "seq-mean-token-mean": "grpo",
    "seq-mean-token-sum-norm": "dr_grpo",
}
# streamrl's algorithm.advantage -> TRL's scale_rewards.
SCALE_REWARDS = {"grpo": "group", "dr_grpo": "none"}
THREADS = 2


class RecipeError(ValueError):
    """A config whose recipe TRL's GRPOTrainer cannot follow; the message is one line."""


def samples_per_step(config: Config) -> int:
    return config.learner.groups_per_step * config.generator.group_size


def grpo_kwargs(config: Config, *, bf16: bool, output_dir: str, seed: int) -> dict[str, Any]:
    """``trl.GRPOConfig`` keyword arguments for ``config``'s recipe (a plain dict: nothing of
    TRL is imported). Raises ``RecipeError`` for what GRPOTrainer has no equivalent of."""
    algo, learner, gen = config.algorithm, config.learner, config.generator
    refused = [
        (algo.advantage not in SCALE_REWARDS, f"algorithm.advantage={algo.advantage}"),
        (algo.loss_agg not in LOSS_TYPES, f"algorithm.loss_agg={algo.loss_agg}"),
        (algo.overlong_buffer.length > 0, "algorithm.overlong_buffer.length > 0"),
        (algo.kl.coef > 0 and algo.kl.kind != "k3", f"algorithm.kl.kind={algo.kl.kind}"),
        (algo.kl.coef > 0 and algo.kl.in_reward, "algorithm.kl.in_reward=true"),
        (algo.kl.adaptive_target is not None, "algorithm.kl.adaptive_target"),
        (learner.mini_batches != 1, f"learner.mini_batches={learner.mini_batches}"),
        (learner.ppo_epochs != 1, f"learner.ppo_epochs={learner.ppo_epochs}"),
        (gen.group_size < 2, "generator.group_size < 2 (GRPOTrainer needs 2 or more)"),
    ]
    for bad, what in refused:
        if bad:
            raise RecipeError(f"{what}: TRL's GRPOTrainer has no equivalent (trl_peer.py doc)")
    batch = samples_per_step(config)
    # The step in micro-batches of learner.micro_batch_size rows where they divide it (the
    # gradient is the same: dapo normalises by the whole step's tokens), else in one.
    micro = learner.micro_batch_size if batch % learner.micro_batch_size == 0 else batch
    micro = min(micro, batch)
    return {
        "output_dir": output_dir,
        "seed": seed,
        "max_steps": config.run.max_steps,
        "use_cpu": True,
        "bf16": bf16,
        "gradient_checkpointing": False,
        # The batch: groups_per_step prompts x group_size samples, generated once per step.
        "num_generations": gen.group_size,
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": batch // micro,
        "shuffle_dataset": False,  # the stream's order, as streamrl's admission hands it out
        "max_completion_length": gen.max_new_tokens,
        "temperature": gen.temperature,
        "top_p": gen.top_p,
        "top_k": gen.top_k,
        # The optimiser.
        "learning_rate": learner.lr,
        "adam_beta1": learner.betas[0],
        "adam_beta2": learner.betas[1],
        "weight_decay": learner.weight_decay,
        "max_grad_norm": learner.grad_clip,
        "warmup_steps": learner.warmup_steps,
        "lr_scheduler_type": "cosine_warmup_with_min_lr",
        "lr_scheduler_kwargs": {
            "min_lr_rate": learner.min_lr_ratio if learner.lr_schedule == "cosine" else 1.0
        },
        # The objective.
        "loss_type": LOSS_TYPES[algo.loss_agg],
        "scale_rewards": SCALE_REWARDS[algo.advantage],
        "beta": algo.kl.coef,
        "epsilon": algo.clip_low,
        "epsilon_high": algo.clip_high,
        "entropy_coef": algo.entropy_coef,
        "num_iterations": 1,
        "mask_truncated_completions": False,
        # Quiet: no checkpoints, no trackers, TRL's own eval off (the callback evaluates).
        "save_strategy": "no",
        "eval_strategy": "no",
        "report_to": "none",
        "logging_steps": 1,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }


def recipe_notes(config: Config, kwargs: dict[str, Any]) -> list[str]:
    """What differs from streamrl's run of ``config`` (module doc), for ``result.json``."""
    notes = [
        "seconds count from the start of training: model load and trainer setup excluded "
        "(setup_s), held-out evals included (eval_s)",
        "synchronous: HF generate then train on the same weights, nothing overlaps; no "
        "off-policy correction (none needed)",
        f"loss_agg {config.algorithm.loss_agg} -> TRL loss_type={kwargs['loss_type']}; "
        f"advantage {config.algorithm.advantage} -> scale_rewards={kwargs['scale_rewards']} "
        "(std + 1e-4, streamrl std + 1e-6)",
        "lr schedule: transformers cosine_warmup_with_min_lr (min_lr_rate "
        f"{kwargs['lr_scheduler_kwargs']['min_lr_rate']}): warmup as streamrl's, the cosine "
        "decay one step ahead of streamrl's",
        f"compute: {'bf16 autocast over fp32 weights' if kwargs['bf16'] else 'fp32'}, "
        f"{THREADS} torch threads, no gradient checkpointing",
    ]
    if config.buffer.drop_zero_variance:
        notes.append(
            "no dynamic-sampling refill: zero-variance groups are trained on (advantage 0, their "
            "tokens counted in the mean), not replaced as streamrl's buffer.drop_zero_variance does"
        )
    if config.learner.weight_decay > 0:
        notes.append("weight decay skips biases and norms (HF Trainer); streamrl decays all")
    if config.algorithm.guidance:
        notes.append(
            "no off-policy guidance: a group no sample of which scores as well as its "
            "reference response trains as sampled, where streamrl's algorithm.guidance puts "
            "the reference in place of a sample"
        )
    return notes


# --------------------------------------------------------------------------- data and reward


def train_rows(config: Config, seed: int, count: int) -> list[dict[str, Any]]:
    """Prompts 0 .. count-1 of the run's seeded stream as TRL dataset rows (conversational
    ``prompt``, plus what the reward needs)."""
    from streamrl.data import PromptStream

    stream = PromptStream(config.data, seed)
    rows = []
    for i in range(count):
        prompt = stream[i]
        rows.append(
            {
                "prompt": [dict(m) for m in prompt.messages],
                "ground_truth": prompt.ground_truth,
                "data_source": prompt.data_source,
                "prompt_id": prompt.prompt_id,
            }
        )
    return rows


class StreamrlReward:
    """The config's ``rewards:`` (streamrl's ``CombinedReward``) as one TRL reward function;
    keeps the mean raw reward of every step's batch (``train_reward``)."""

    __name__ = "streamrl_reward"  # TRL names its reward metrics after the function

    def __init__(self, config: Config, tokenizer, stops: tuple[int, ...]) -> None:
        from streamrl.rewards import CombinedReward

        self.reward = CombinedReward(config.rewards)
        self.tokenizer, self.stops = tokenizer, stops
        self.per_step = samples_per_step(config)
        self.means: list[list[float]] = []

    def __call__(self, prompts, completions, completion_ids, ground_truth, data_source, **kw):
        from streamrl.rewards import RewardInput

        values = []
        prompts = prompts or [None] * len(completion_ids)
        rows = zip(prompts, completion_ids, ground_truth, data_source, strict=True)
        for prompt, ids, truth, source in rows:
            # TRL's completion ids end at the first stop token, kept (as streamrl's response ids).
            ids = [int(t) for t in ids]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)  # as streamrl decodes
            finish = "stop" if ids and ids[-1] in self.stops else "length"
            # The question, as the generator passes it: the prompt's last message.
            question = prompt[-1]["content"] if isinstance(prompt, list) and prompt else ""
            reward_input = RewardInput(text, ids, truth, source, question, finish_reason=finish)
            values.append(self.reward(reward_input))
        state = kw.get("trainer_state")
        step = (state.global_step if state is not None else len(self.means)) + 1
        self.means.append([float(step * self.per_step), sum(values) / max(len(values), 1)])
        return values


# --------------------------------------------------------------------------- evaluation


def stop_and_cut(ids: list[int], stops: tuple[int, ...]) -> tuple[list[int], str]:
    """A generated row cut after its first stop token (kept), and its finish reason."""
    for i, token in enumerate(ids):
        if token in stops:
            return ids[: i + 1], "stop"
    return ids, "length"


def evaluate(model, tokenizer, config: Config, prompts, stops, bf16: bool, version: int):
    """streamrl's held-out eval with HF ``generate`` on ``model`` (workers.generation.evaluator's
    recipe: the same prompts, encoding, token limit, stop tokens and scoring)."""
    import torch

    from streamrl.evaluation import score
    from streamrl.models import encode_prompt

    ev = config.eval
    encoded = [encode_prompt(tokenizer, p, config.data.max_prompt_tokens) for p in prompts]
    width = max(len(ids) for ids in encoded)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded])
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded])
    sampling = ev.temperature > 0
    extra = {"temperature": ev.temperature, "top_p": 1.0, "top_k": 0} if sampling else {}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                do_sample=sampling,
                max_new_tokens=ev.max_new_tokens or config.generator.max_new_tokens,
                num_return_sequences=ev.samples,
                eos_token_id=list(stops),
                pad_token_id=pad,
                **extra,
            )
    finally:
        model.train(was_training)
    responses = []
    for row in out[:, width:].tolist():
        ids, reason = stop_and_cut(row, stops)
        responses.append((tokenizer.decode(ids, skip_special_tokens=True), ids, reason))
    return score(config, prompts, responses, version).metrics


def make_eval_callback(config: Config, tokenizer, stops, bf16: bool, clock: dict, curve: list):
    """A TrainerCallback that evaluates before training, every ``eval.every`` steps and after
    the last step, appending curve points (seconds since ``clock["t0"]``)."""
    from transformers import TrainerCallback

    from streamrl.evaluation import eval_prompts

    prompts = eval_prompts(config)
    per_step = samples_per_step(config)

    class HeldOutEval(TrainerCallback):
        def _run(self, model, step: int) -> None:
            begun = time.time()
            clock["in_eval"] = True
            try:
                m = evaluate(model, tokenizer, config, prompts, stops, bf16, step)
            finally:
                clock["in_eval"] = False
            clock["eval_s"] += time.time() - begun
            point = {
                "samples": step * per_step,
                "seconds": time.time() - clock["t0"],
                "exact": m["eval/exact_match"],
                "completed": m["eval/completed"],
                "reward_mean": m["eval/reward_mean"],
            }
            curve.append(point)
            print(
                f"[trl-peer] eval step {step}: exact {point['exact']:.3f} completed "
                f"{point['completed']:.3f} reward {point['reward_mean']:.3f} "
                f"({point['seconds']:.1f} s)",
                flush=True,
            )

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if config.eval.before_train:
                self._run(model, 0)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            step = state.global_step
            if (config.eval.every and step % config.eval.every == 0) or step == state.max_steps:
                self._run(model, step)

    return HeldOutEval()


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="a streamrl config (default: the shipped default job)")
    parser.add_argument("--seed", type=int, default=None, help="run.seed (default: the config's)")
    parser.add_argument("--out", required=True, help="directory for result.json")
    parser.add_argument("overrides", nargs="*", help="section.key=value, as streamrl launch")
    return parser.parse_args(argv)


def load(args: argparse.Namespace) -> Config:
    overrides = list(args.overrides)
    if args.seed is not None:
        overrides.append(f"run.seed={args.seed}")
    return load_config(args.config or default_config_path(), overrides)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = load(args)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        result = run(config, out)
    except (ConfigError, RecipeError) as exc:
        print(f"trl_peer: {exc}", file=sys.stderr)
        return 2
    (out / "result.json").write_text(json.dumps(result, indent=1))
    last = result["curve"][-1]
    print(
        f"[trl-peer] trl {result['trl_version']}: {result['steps']} steps, "
        f"{result['steps'] * samples_per_step(config)} samples in {result['wall_s']:.1f} s "
        f"(+{result['setup_s']:.1f} s setup, {result['eval_s']:.1f} s of it eval); held-out "
        f"exact {result['curve'][0]['exact']:.3f} -> {last['exact']:.3f}, completed "
        f"{last['completed']:.3f}; {result['cpu']}; {out / 'result.json'}",
        flush=True,
    )
    return 0


def dtype_probe(model, clock: dict) -> tuple[set, Any]:
    """Which dtype the first decoder block's MLP computes in, outside the held-out evals:
    ``{("generate" | "train", dtype)}`` (generation runs without grad, training with it)."""
    import torch

    seen: set[tuple[str, str]] = set()

    def hook(_module, _args, output) -> None:
        if not clock["in_eval"]:
            seen.add(("train" if torch.is_grad_enabled() else "generate", str(output.dtype)))

    return seen, model.model.layers[0].mlp.register_forward_hook(hook)


def run(config: Config, out: Path) -> dict[str, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import torch

    torch.set_num_threads(THREADS)
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from streamrl.hardware import cpu_description, resolve_compute_dtype
    from streamrl.models import load_tokenizer, resolve_model, stop_token_ids

    seed = config.run.seed
    bf16 = resolve_compute_dtype(config.model.compute_dtype, "cpu") == "bfloat16"
    kwargs = grpo_kwargs(config, bf16=bf16, output_dir=str(out / "trainer"), seed=seed)
    notes = recipe_notes(config, kwargs)

    model_dir = resolve_model(
        config.model.name,
        tiny_hidden=config.model.tiny_hidden,
        tiny_layers=config.model.tiny_layers,
    )
    tokenizer = load_tokenizer(model_dir)
    tokenizer.padding_side = "left"
    stops = stop_token_ids(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # TRL stops a completion at the tokenizer's EOS and at the model's generation-config EOS ids.
    model.generation_config.eos_token_id = list(stops)
    model.generation_config.pad_token_id = tokenizer.pad_token_id

    rows = train_rows(config, seed, config.run.max_steps * config.learner.groups_per_step)
    too_long = sum(
        len(tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True))
        > config.data.max_prompt_tokens
        for r in rows
    )
    if too_long:
        notes.append(
            f"{too_long} training prompts exceed data.max_prompt_tokens: TRL keeps them whole"
        )
    reward = StreamrlReward(config, tokenizer, stops)
    curve: list[dict[str, float]] = []
    clock = {"t0": time.time(), "eval_s": 0.0, "in_eval": False}
    dtypes, probe = dtype_probe(model, clock)
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=trl.GRPOConfig(**kwargs),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[make_eval_callback(config, tokenizer, stops, bf16, clock, curve)],
    )
    clock["t0"] = time.time()
    setup_s = clock["t0"] - STARTED
    trainer.train()
    wall_s = time.time() - clock["t0"]
    probe.remove()
    return {
        "wall_s": wall_s,
        "steps": int(trainer.state.global_step),
        "curve": curve,
        "train_reward": reward.means,
        "setup_s": setup_s,
        "eval_s": clock["eval_s"],
        "cpu": cpu_description(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
        "trl_version": trl.__version__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "seed": seed,
        "samples_per_step": samples_per_step(config),
        "compute_dtypes": sorted(f"{role}: {dtype}" for role, dtype in dtypes),
        "grpo_config": kwargs,
        "notes": notes,
    }


if __name__ == "__main__":
    sys.exit(main())
