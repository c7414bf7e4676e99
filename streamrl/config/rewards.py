"""What scores a response: ``rewards:`` entries (a rule, a reward model, a judge, a teacher)
and the served scoring roles' section (``scoring:``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from streamrl.config.base import _Section


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
