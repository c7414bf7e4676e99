"""The rules a field's type cannot state, applied once a config has decoded (``_finalize``):
the settings one choice implies, the rules between keys, a reward entry's shape, a template's
fields; and a warning for settings that run but train worse."""

from __future__ import annotations

import logging
import string
from typing import Any

from streamrl.config.base import ConfigError
from streamrl.config.key_rules import cross_key_problems
from streamrl.config.rewards import _one_top_k_teacher_per_source
from streamrl.config.schema import Config

log = logging.getLogger(__name__)


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
    resolve_auto_screening(config)
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
            not config.generator.screen_samples or not _why_screening_cannot_decide(config),
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


def _why_screening_cannot_decide(config: Config) -> str:
    """Why screening cannot settle a group by its first samples' rule scores, "" if it can:
    the one list the refusal of a number and the resolution of ``auto`` both read."""
    reasons = (
        (any(r.served for r in config.rewards), "a served reward scores the groups"),
        (bool(config.env.name), "groups are episodes"),
        (config.generator.probe_candidates > 1, "probe sampling chooses the prompts"),
        (not config.buffer.drop_zero_variance, "flat groups are trained on"),
    )
    return next((why for cannot, why in reasons if cannot), "")


def resolve_auto_screening(config: Config) -> None:
    """``generator.screen_samples: auto`` -> half the group where screening can decide a
    group by its first samples, 0 (off, said once in the log) where it cannot
    (``_why_screening_cannot_decide``) or where groups are under 4. A number is the user's
    own choice and is checked as given. Example: group_size 8, rules only -> 4."""
    gen = config.generator
    if gen.screen_samples != "auto":
        return
    why_not = _why_screening_cannot_decide(config)
    if not why_not and gen.group_size < 4:
        why_not = f"groups of {gen.group_size} are too small to split"
    gen.screen_samples = 0 if why_not else gen.group_size // 2
    if why_not:
        log.info("generator.screen_samples: auto -> off (%s)", why_not)


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
