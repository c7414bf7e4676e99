"""Rewards by name (``rewards:`` in the config; docs/design.md §7): a rule is a function of a
``RewardInput`` that returns a float; a reward model or an LLM judge is served by a reward role
(``workers.reward_roles.reward_role``) behind the ``Scorer`` interface. The built-in
rules (``REWARDS``, ``streamrl.rewards.rules``):

- ``numeric_match``: the number the response states is the ground truth (``partial`` for it
  anywhere else); ``numeric_close``: credit for a near miss; ``number_only``: a bare number;
- ``equation_form``: the question restated as an equation that ends in a number (the default
  job's format reward); ``stopped``: the model ended the response (after another reward's 1);
- ``gsm8k``, ``boxed_math``: math answers compared by math-verify (``streamrl[math]``);
- ``countdown``, ``countdown_close``: the countdown task's verifier and its near misses;
- ``reasoning_gym``: a reasoning-gym prompt's own verifier;
- ``exact_match``, ``target_token_share``: plain text equality; a signal for tests.

A user's rule is ``module:function`` (or ``python:<name>`` from ``streamrl.train``), resolved
as the built-ins are (``resolve_reward``). Everything is resolved when the config loads
(``check_rewards``), so a typo fails before any process starts. Several rewards combine as a
weighted sum (``CombinedReward``; with served scores and normalisation, ``rewards.mix``).

The family: ``base`` (``RewardInput``, the registry), ``rules``, ``math_answers`` (math-verify
behind the math rules and the exact check), ``mix`` (several rewards' scores into one reward),
``scorer`` (what a served scorer is given and gives), ``model`` (a sequence-classification
reward model served) and ``model_training`` (training one, ``streamrl rm``). This package and
all of them but the two ``model`` modules import no torch.
"""

from __future__ import annotations

import logging
from typing import Any

from streamrl.config import ConfigError, RewardSpec
from streamrl.rewards.base import REWARDS, RewardFn, RewardInput, register, resolve_reward
from streamrl.rewards.math_answers import require_math_verify
from streamrl.rewards.rules import (
    boxed_math,
    countdown,
    countdown_close,
    equation_form,
    exact_match,
    gsm8k,
    number_only,
    numeric_close,
    numeric_match,
    reasoning_gym,
    stated_number,
    stopped,
    target_token_share,
)

__all__ = [
    "REWARDS",
    "CombinedReward",
    "RewardFn",
    "RewardInput",
    "RuleError",
    "boxed_math",
    "check_rewards",
    "countdown",
    "countdown_close",
    "equation_form",
    "exact_match",
    "gsm8k",
    "number_only",
    "numeric_close",
    "numeric_match",
    "reasoning_gym",
    "register",
    "resolve_reward",
    "stated_number",
    "stopped",
    "target_token_share",
]

log = logging.getLogger(__name__)


class RuleError(Exception):
    """A rule reward raised scoring a response; its message is one line naming the rule."""


class CombinedReward:
    """The job's rule rewards (``rewards:`` entries with a ``name``; model rewards and judges
    are served by reward roles, ``workers.generation.scoring``): each one's score of a response.

    Two readings of a failing rule. Training (``checked_scores``, run by the generator's rule
    worker, ``workers.generation.rule_worker``) raises ``RuleError``, and the group is refused and
    counted as a served reward's error is: a 0 beside real scores would be a wrong reward
    the learner trains on. The held-out check (``scores``, ``__call__``) scores the failure
    0, a wrong answer, and counts it in ``errors`` (the first is logged)."""

    def __init__(self, specs: list[RewardSpec]) -> None:
        self.parts: list[tuple[str, RewardFn, float, dict[str, Any]]] = [
            (s.name, resolve_reward(s.name), s.weight, dict(s.args)) for s in specs if not s.served
        ]
        self.errors = 0

    def checked_scores(self, sample: RewardInput) -> list[float]:
        """Each rule's score of ``sample``, unweighted, in config order; ``RuleError`` (one
        line: the rule's name, the exception) for the first rule that raises."""
        out = []
        for name, fn, _, kwargs in self.parts:
            try:
                out.append(float(fn(sample, **kwargs)))
            except Exception as exc:  # a user's rule: whatever it raises refuses its group
                why = " ".join(f"{type(exc).__name__}: {exc}".split())
                raise RuleError(f"reward {name!r} raised {why}") from exc
        return out

    def scores(self, sample: RewardInput) -> list[float]:
        """``checked_scores``, with a rule that raises scored 0 and counted (class doc)."""
        out = []
        for name, fn, _, kwargs in self.parts:
            try:
                out.append(float(fn(sample, **kwargs)))
            except Exception:  # a user plugin bug must not kill the evaluation
                if not self.errors:  # once: the counts are on every report
                    log.exception("reward %r raised; scored 0 (counted in reward_errors)", name)
                self.errors += 1
                out.append(0.0)
        return out

    def __call__(self, sample: RewardInput) -> float:
        return sum(w * v for (_, _, w, _), v in zip(self.parts, self.scores(sample), strict=True))


# Built-in rewards that compare by math-verify (the extra ``streamrl[math]``).
_NEEDS_MATH_VERIFY = ("boxed_math", "gsm8k")


def check_rewards(specs: list[RewardSpec]) -> None:
    """Every reward resolves, and a built-in one accepts its ``args`` (probed on one sample,
    so ``scale: 0`` or a misspelt argument fails at load, not as counted errors mid-run)."""
    for spec in specs:
        # A reward model or a judge: its role checks it (workers.reward_roles.reward_role).
        if spec.served:
            continue
        fn = resolve_reward(spec.name)
        if "after" in spec.args:  # a reward gated on another (``stopped``) names it
            resolve_reward(str(spec.args["after"]))
        for name in (spec.name, str(spec.args.get("after", ""))):
            if name in _NEEDS_MATH_VERIFY:
                require_math_verify(f"the reward {name!r}")
        if spec.name in REWARDS:
            try:
                fn(RewardInput("1", [], "1", finish_reason="stop"), **spec.args)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"reward {spec.name!r} args {dict(spec.args)}: {exc}") from None
