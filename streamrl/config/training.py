"""The sections that say how the policy is updated: the learner and its optimizer, the loss
(``algorithm:``), the weight stream back to the generators and the held-out evaluation."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from streamrl.config.base import _Section


class LearnerConfig(_Section):
    """The learner ranks and the optimizer. Set by the job author, but for the hardware and
    the memory (marked operator: none of them changes the update)."""

    # operator: ranks, their device and collective backend.
    count: Annotated[int, msgspec.Meta(ge=1)] = 1
    device: str = "cpu"
    backend: Literal["gloo", "nccl"] = "gloo"
    # operator: GPUs per learner rank (Ray placement group, packed); > 0 implies device=cuda,
    # nccl.
    gpus: float = 0.0
    # Prompt groups per optimizer step, across all ranks (must divide by `count`).
    groups_per_step: int = 4
    lr: Annotated[float, msgspec.Meta(gt=0)] = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    # operator: rows per micro-batch (the loss is the same however a batch is split).
    micro_batch_size: Annotated[int, msgspec.Meta(ge=1)] = 8
    # operator: > 0: micro-batches cut by tokens instead of micro_batch_size rows: trajectories
    # sorted by length, each micro-batch at most this many padded tokens (rows x longest; a longer
    # trajectory goes alone), as many on every rank. Less padding when lengths vary.
    micro_batch_tokens: Annotated[int, msgspec.Meta(ge=0, extra={"zero": "off"})] = 0
    # operator: a group's samples share their prompt: encode it once per micro-batch, with each
    # response attending to it through a 4-D mask, where that costs less
    # (workers/learning/batching).
    share_prompts: bool = True
    # Optimizer steps per batch (PPO mini-batches; each rank splits its groups evenly) and
    # passes over the batch. More than one update makes the clip act: proximal logprobs are
    # then computed once, without grad, before the first update. The version still advances
    # once per batch.
    mini_batches: Annotated[int, msgspec.Meta(ge=1)] = 1
    ppo_epochs: Annotated[int, msgspec.Meta(ge=1)] = 1
    # Learning-rate schedule over versions: linear warmup, then constant or cosine decay to
    # lr * min_lr_ratio at run.max_steps.
    warmup_steps: Annotated[int, msgspec.Meta(ge=0)] = 0
    lr_schedule: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.0
    # operator: recompute each decoder block's activations in backward (less memory, about a
    # third more compute).
    activation_checkpointing: bool = False
    # operator: torch intra-op threads per rank; 0 = auto (as generator.threads).
    threads: Annotated[int, msgspec.Meta(ge=0, extra={"zero": "auto"})] = 0
    # operator: seconds to wait for a full batch before logging that the learner is starved.
    batch_wait_log_s: float = 30.0


class KLConfig(_Section):
    """A KL penalty toward the reference policy. Set by the job author."""

    kind: Literal["k1", "abs", "k2", "k3"] = "k3"
    coef: float = 0.0
    adaptive_target: float | None = None
    adaptive_horizon: int = 10000
    in_reward: bool = False


class OverlongConfig(_Section):
    """Set by the job author."""

    # DAPO soft overlong punishment: responses longer than generator.max_new_tokens - length
    # lose up to `penalty` of score, linearly (0 disables). An episode is judged by its longest
    # policy turn, which is what max_new_tokens caps (docs/algorithms.md).
    length: int = 0
    penalty: float = 1.0


class AlgorithmConfig(_Section):
    """The advantage, the off-policy correction and the loss (docs/algorithms.md). Set by the
    job author."""

    advantage: Literal["grpo", "dr_grpo", "rloo", "gae"] = "grpo"
    # GRPO only: divide by max(group std, std_floor), so that groups differing only by small
    # shaping rewards are not scaled up to a right-vs-wrong group's size (0: plain GRPO).
    std_floor: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    correction: Literal["none", "token-tis", "seq-tis", "token-mask", "seq-mask"] = "token-tis"
    is_cap: Annotated[float, msgspec.Meta(gt=0)] = 2.0
    is_low: float | None = None
    proximal: Literal["recompute", "behavior"] = "recompute"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: Annotated[float, msgspec.Meta(gt=1)] | None = None
    loss_agg: Literal[
        "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
    ] = "token-mean"
    kl: KLConfig = msgspec.field(default_factory=KLConfig)
    overlong_buffer: OverlongConfig = msgspec.field(default_factory=OverlongConfig)
    # The entropy bonus: loss -= coef * entropy (token mean at the sampling temperature).
    entropy_coef: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    # Adaptive entropy control (streamrl.algorithms.entropy): with a target (nats per token),
    # the coefficient, starting at entropy_coef, rises by entropy_coef_step after each step
    # whose entropy is below the target and falls by it otherwise, within [0,
    # entropy_coef_max], and the bonus acts only on micro-batches below the target. A collapse
    # onto one answer per prompt is met before dynamic sampling starves the run.
    entropy_target: Annotated[float, msgspec.Meta(gt=0)] | None = None
    entropy_coef_step: Annotated[float, msgspec.Meta(ge=0)] = 0.005
    entropy_coef_max: Annotated[float, msgspec.Meta(ge=0)] = 0.1
    # Off-policy guidance (workers/generation/guidance.py): a group none of whose samples
    # scores as well as its prompt's reference response (a built-in task's worked answer, a
    # table's ``data.reference_key``) trains on the reference in place of one sample, so a
    # question the policy gets wrong every time still moves it (LUFFY, Yan et al. 2025).
    guidance: bool = False
    # GAE (advantage=gae trains a critic beside the policy).
    gamma: float = 1.0
    lam: float = 0.95
    value_clip: float = 0.2
    value_coef: float = 0.5
    critic_lr: float | None = None  # None = learner.lr
    # Allow an asynchronous run without an off-policy correction (usually a mistake).
    allow_uncorrected: bool = False


class WeightsConfig(_Section):
    """The weight stream from the learners to the generators (docs/design.md §4). Set by the
    operator, rarely."""

    # A tensor whose changed fraction exceeds this is sent dense instead of as a sparse diff.
    dense_threshold: float = 0.25
    # ZeroMQ send high-water mark on the publisher (messages); a slow subscriber misses diffs.
    pub_hwm: int = 64
    # The bytes of the bf16 image one published chunk covers, at most (its payload is at
    # most that): a diff's chunks leave as they are encoded and are written as they arrive.
    chunk_bytes: int = 16 * 1024 * 1024
    # A subscriber that knows of a newer version (or holds an incomplete diff) but cannot move
    # for this long asks the learner ranks for anchors.
    anchor_timeout_s: float = 5.0
    # Every N versions (and at every checkpoint asked for by the admin API) each learner rank
    # sends a checksum of its whole shard; each generator checks its copy of that shard and
    # repairs a mismatch with an anchor. Catches a block that diverged silently and that no
    # later diff touches (block checksums cover only the blocks a diff changed). 0 = off.
    verify_every: Annotated[int, msgspec.Meta(ge=0, extra={"zero": "off"})] = 10


class EvalConfig(_Section):
    """Evaluation on held-out prompts and early stopping. Set by the job author."""

    # Evaluate on held-out prompts every N learner steps, before step 1 (before_train) and at
    # the final version; 0 = never during a run. Generator 0 is asked (eval.runs_on says where).
    every: Annotated[int, msgspec.Meta(ge=0)] = 0
    # Where it runs: "slack", a process of its own beside generator 0 with its own engine, at
    # the lowest CPU priority on every core of the run (it takes what the learner and the
    # generators leave; docs/design.md §5); "generator", in generator 0's loop between its
    # calls; "auto": slack when the generators run on CPU, else generator (a second engine on
    # a GPU would take its memory).
    runs_on: Literal["auto", "slack", "generator"] = "auto"
    before_train: bool = True
    # "" = data.source's held-out questions (its eval_split, or the rows held out of its
    # split); else another source of any kind data.source takes, read with data's mapping
    # (for a table: data.eval_split if set, else every row; none of it is trained on).
    source: str = ""
    # How a response is judged correct (eval/exact_match): "" = the check of the prompt's
    # data_source (a built-in task's, GSM8K's, MATH's, reasoning-gym's verifier; else the
    # number the first line states), or a reward (a registered name or module:function):
    # correct when it pays at least 1.
    check: str = ""
    seed: int = 10_007
    max_prompts: Annotated[int, msgspec.Meta(ge=1)] = 64
    # 0 = greedy; with samples > 1 at a temperature > 0, eval/pass_at_k is reported too.
    temperature: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    samples: Annotated[int, msgspec.Meta(ge=1)] = 1
    max_new_tokens: int | None = None  # None = generator.max_new_tokens
    # The arithmetic task's held-out questions are also asked in a wording training never
    # uses, with no system prompt, before training and at the final version
    # (eval/unseen_phrasing/*): did the run learn arithmetic, or one prompt's answer format?
    # "" = not asked. {a}, {op} and {b} are filled in.
    unseen_phrasing: str = "Compute {a} {op} {b}."
    # What the model answered: each evaluation keeps the responses to the first N held-out
    # prompts (the same prompts every time, all their samples) with their question, scores
    # and check, in RUN_DIR/answers.jsonl and a wandb table (eval/answers), so a collapse or
    # a reward hack shows without opening the log. 0: none kept.
    keep_answers: Annotated[int, msgspec.Meta(ge=0)] = 16
    # Early stopping: end the run (gracefully) after this many evaluations in a row without a
    # gain of more than `min_delta` in `patience_metric` over the best so far. 0 = never; with
    # eval.every 0 there are no evaluations to count, so it never fires.
    patience: Annotated[int, msgspec.Meta(ge=0, extra={"zero": "never"})] = 0
    # "" = eval/success for episode jobs (env.name), else eval/completed. The metric both stop
    # rules and the best version (summary.json "best") read.
    patience_metric: str = ""
    # Over-optimisation: end the run (gracefully) once patience_metric has fallen more than
    # this below the best it reached: a learned reward can climb while the held-out rule
    # check falls. summary.json names the best version and its checkpoint. 0 = never.
    stop_below_best: Annotated[float, msgspec.Meta(ge=0, extra={"zero": "never"})] = 0.0
    min_delta: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    # The run's model (hf/, and adapter/ for LoRA) is the version whose evaluation scored best
    # in patience_metric, not the last one; the last moves to hf-last/ (adapter-last/). For a
    # learned reward that the policy over-optimises. Needs a checkpoint at every evaluation:
    # run.checkpoint_every must divide eval.every.
    keep_best: bool = False
