"""Held-out evaluation: did the model get better? (``eval:`` in the config, ``streamrl eval``).

Prompts come from ``eval.source`` ("" = ``data.source``): a generated task's held-out split
(questions training never draws, ``data.holdout_every``; ``streamrl.tasks``), or a table's
(``data.eval_split``, or the rows held out of ``data.split``; ``streamrl.data``), or every row
of another table; ``eval.max_prompts`` of them. They are drawn without replacement by key (a
task's ``b + a`` is ``a + b``; a table's row by its prompt), so ``eval/prompts`` is the number
of distinct questions, the n of the figures' standard error; when the split holds fewer than
``eval.max_prompts``, all of them are asked and a warning says how many. Each is decoded
``eval.samples`` times at ``eval.temperature`` (0 = greedy) and every response is scored
twice:

- by the run's verifiers (``rewards:``), as training is: ``eval/reward_mean``, and
  ``eval/accuracy``, the share of responses given the top reward (the sum of the weights);
- by the exact check (``exact_answer``): ``eval.check`` when set (a reward, correct when it pays at
  least 1), else the check of the prompt's ``data_source`` (``EXACT_CHECKS``; reasoning-gym's
  verifier for its prompts, a full score): ``eval/exact_match``. Arithmetic, chain and any other
  source use ``first_line_answer``, which shares no code with the training rewards: the number the
  first non-empty line states must equal the ground truth exactly, the number right after its last
  ``=`` when the line is an equation, else its first number (for a non-numeric ground truth, the
  stripped first line must equal it). A number has an optional sign (``+`` or ``-``), commas only
  between groups of three digits (``1,024``; ``4,2`` states 4) and an optional decimal part. This is
  the stated answer of ``rewards.stated_number`` too, read by code of its own; a table-driven test
  holds the two to the same cases. Countdown's ground truth is a puzzle, not a number: its check is
  the task's verifier (the expression uses the given numbers and reaches the target). GSM's reads
  the number after ``####``, and so does a file's row whose ``data_source`` is GSM8K's
  (``openai/gsm8k``, as verl's preprocessing names it, or ``gsm8k``).

``eval/completed`` counts a response only if it is exact *and* ended on its own (a stop
token, not the token limit): raw reward and exact match credit an answer whose first line is
right even when the model would have gone on, and a run that learns to answer and stop is the
one to trust (marin's async RL study, 2026).

With ``samples > 1``, ``eval/pass_at_k`` is the share of prompts with at least one exact
answer among their ``k = samples`` responses. In a run, generator 0 evaluates between its
generation calls on the version the controller names (or newer: ``eval/version`` says which);
the responses never reach the buffer.

This module says what is evaluated and how it is scored, without torch; running it on an
engine (the generator's, or ``streamrl eval``'s) is ``workers.generation.evaluator``'s.

Example: ground truth ``"7"``; ``"7"``, ``" 7.\\nbecause 3 + 4"`` and ``"3 + 4 = 7"`` are
exact; ``"7 + 0 = 8"`` and ``"3 + 4 ="`` are not.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import msgspec
import numpy as np

from streamrl.config import Config
from streamrl.data import DataError, Prompt, evaluated_rows
from streamrl.rewards.math_answers import math_exact
from streamrl.tasks import TASKS, gsm, task_for
from streamrl.tasks import reasoning_gym as gym
from streamrl.tasks.arithmetic import arithmetic_question

log = logging.getLogger(__name__)

# A number as an answer states it (module doc): "-7", "+42", "1,024", "2.5"; not "4,2" (4).
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")


def _value(number: str) -> Fraction:
    return Fraction(number.replace(",", ""))


def first_line_answer(response: str, ground_truth: str) -> bool:
    """True if the response's first non-empty line answers ``ground_truth`` (module doc)."""
    line = next((part.strip() for part in response.splitlines() if part.strip()), "")
    truth = _NUMBER.fullmatch(ground_truth.strip())
    if truth is None:
        return line == ground_truth.strip()
    if "=" in line:
        # An equation states its answer on the right: "3 + 4 = 7" answers 7, and "3 + 0 = 5"
        # does not answer 3 (the first number would say it does).
        match = _NUMBER.match(line.rsplit("=", 1)[1].strip())
    else:
        match = _NUMBER.search(line)
    return match is not None and _value(match.group()) == _value(truth.group())


# The exact check of a prompt by its data_source: a built-in task's own, GSM8K's for a file of
# GSM8K rows; anything else is read by ``first_line_answer``.
EXACT_CHECKS: dict[str, Callable[[str, str], bool]] = {
    name: task.exact for name, task in TASKS.items() if task.exact is not None
} | {"openai/gsm8k": gsm.final_answer, "gsm8k": gsm.final_answer}
# MATH-style rows (a boxed answer, compared by math-verify), by the data_source names verl's
# default_compute_score grades by the boxed answer (verl/utils/reward_score/__init__.py).
MATH_SOURCES = (
    "lighteval/MATH",
    "DigitalLearningGmbH/MATH-lighteval",
    "HuggingFaceH4/MATH-500",
    "numina_aops_forum",
    "numina_synthetic_math",
    "numina_amc_aime",
    "numina_synthetic_amc",
    "numina_cn_k12",
    "numina_olympiads",
)
EXACT_CHECKS |= dict.fromkeys(MATH_SOURCES, math_exact)


Check = Callable[[Prompt, str], bool]


def exact_answer(prompt: Prompt, response: str) -> bool:
    """Whether ``response`` answers ``prompt`` exactly, by its source's check (module doc)."""
    if prompt.metadata and "reasoning_gym" in prompt.metadata:
        return gym.score(response, prompt.metadata) >= 1.0
    check = EXACT_CHECKS.get(prompt.data_source, first_line_answer)
    return check(response, prompt.ground_truth)


def exact_check(config: Config) -> Check:
    """The run's exact check: ``eval.check``'s reward (correct when it pays at least 1; with
    the args a ``rewards:`` entry of that name gives it), else ``exact_answer``."""
    if not config.eval.check:
        return exact_answer
    from streamrl.config import RewardSpec
    from streamrl.rewards import CombinedReward, RewardInput

    spec = next((r for r in config.rewards if r.name == config.eval.check), None)
    reward = CombinedReward([RewardSpec(name=config.eval.check, args=spec.args if spec else {})])
    return lambda prompt, response: reward(RewardInput.of(prompt, response, [])) >= 1.0


# Draws per asked prompt before concluding that the held-out split has no more distinct
# questions: the rarest question of a split of n is drawn with probability >= 1/(2n) (a sum
# a + b, a != b, is drawn as either order), so 20 draws per asked prompt miss one of the
# split's questions with probability about e^-10 when more are asked than exist.
_DRAWS_PER_PROMPT = 20


def _eval_indices(config: Config) -> list[int]:
    """The indices of the held-out stream's first ``eval.max_prompts`` distinct questions
    (by key), or of all of them if the split holds fewer (with a warning)."""
    ev = config.eval
    source = ev.source or config.data.source
    task = task_for(source)
    seen: set[str] = set()
    indices: list[int] = []
    for i in range(ev.max_prompts * _DRAWS_PER_PROMPT):
        key = task.question(config.data, ev.seed, i, "eval").key
        if key not in seen:
            seen.add(key)
            indices.append(i)
            if len(indices) == ev.max_prompts:
                return indices
    log.warning(
        "eval.max_prompts=%d, but the %s task's held-out split has only %d distinct "
        "held-out questions with these data settings: evaluating those %d",
        ev.max_prompts,
        source,
        len(indices),
        len(indices),
    )
    return indices


def eval_prompts(config: Config) -> list[Prompt]:
    """``eval.max_prompts`` held-out prompts, each question once (the same ones on every
    call; module doc)."""
    ev, data = config.eval, config.data
    source = ev.source or data.source
    task = task_for(source)
    if task is not None:
        return [task.question(data, ev.seed, i, "eval") for i in _eval_indices(config)]
    # The rows held out of data.split, or every row of a split or a table of its own.
    rows, candidates = evaluated_rows(config)
    if len(candidates) == 0:
        raise DataError(f"eval.source {source}: no held-out rows to evaluate")
    order = np.random.default_rng(ev.seed).permutation(len(candidates))
    prompts, seen = [], set()
    for position in order:
        prompt = rows.prompt(candidates[position])
        if prompt.key not in seen:
            seen.add(prompt.key)
            prompts.append(prompt)
            if len(prompts) == ev.max_prompts:
                return prompts
    log.warning(
        "eval.max_prompts=%d, but %s has only %d distinct held-out prompts: evaluating those",
        ev.max_prompts,
        source,
        len(prompts),
    )
    return prompts


UNSEEN = "eval/unseen_phrasing/"  # the prefix of the unseen phrasing's figures


def unseen_phrasing_prompts(config: Config) -> list[Prompt]:
    """The same held-out questions as ``eval_prompts``, worded as ``eval.unseen_phrasing``
    with no system prompt: a wording training never uses. Empty when not asked for, or for a
    source other than the arithmetic task (a file's wording is the file's; the other tasks
    word their questions one way)."""
    ev = config.eval
    if (ev.source or config.data.source) != "arithmetic" or not ev.unseen_phrasing:
        return []
    phrasing = (ev.unseen_phrasing, "")
    return [
        arithmetic_question(config.data, ev.seed, i, "eval", phrasing)
        for i in _eval_indices(config)
    ]


class EvalResult(msgspec.Struct):
    """One evaluation's figures and its responses (for ``streamrl eval --out``)."""

    version: int
    metrics: dict[str, float]
    samples: list[dict[str, Any]] = []


def score(
    config: Config,
    prompts: list[Prompt],
    responses: list[tuple[str, list[int], str]],
    version: int,
) -> EvalResult:
    """Score ``responses`` (text, token ids and finish reason; ``eval.samples`` per prompt,
    in prompt order) by the run's verifiers and by ``exact_answer``; ``version``: the
    weights that wrote them."""
    from streamrl.rewards import CombinedReward, RewardInput

    reward = CombinedReward(config.rewards)
    exact = exact_check(config)
    samples = []
    for i, (text, response_ids, finish_reason) in enumerate(responses):
        prompt = prompts[i // config.eval.samples]
        value = reward(RewardInput.of(prompt, text, response_ids, finish_reason))
        samples.append(
            {
                "prompt_id": prompt.prompt_id,
                "response": text,
                "ground_truth": prompt.ground_truth,
                "reward": value,
                "exact": exact(prompt, text),
                "stopped": finish_reason == "stop",
            }
        )
    return EvalResult(version, _figures(samples, config, len(prompts), version), samples)


def _figures(samples: list[dict[str, Any]], config: Config, prompts: int, version: int) -> dict:
    """The eval/* figures of scored responses (module doc)."""
    n = max(len(samples), 1)
    # The rules' top score (served rewards are scored by their roles, not here).
    top_reward = sum(spec.weight for spec in config.rewards if not spec.served)
    figures = {
        "eval/reward_mean": sum(s["reward"] for s in samples) / n,
        "eval/accuracy": sum(s["reward"] >= top_reward - 1e-9 for s in samples) / n,
        "eval/exact_match": sum(s["exact"] for s in samples) / n,
        "eval/completed": sum(s["exact"] and s["stopped"] for s in samples) / n,
        "eval/prompts": float(prompts),
        "eval/version": float(version),
    }
    if all(spec.served for spec in config.rewards):
        # No rule: the rules' reward and accuracy mean nothing (the served rewards' view is
        # ``eval/reward/<label>``, the generator's); the exact check is the true accuracy.
        del figures["eval/reward_mean"], figures["eval/accuracy"]
    if config.eval.samples > 1:
        solved = {s["prompt_id"] for s in samples if s["exact"]}
        figures["eval/pass_at_k"] = len(solved) / max(prompts, 1)
    return figures


def format_table(rows: dict[str, dict[str, float]]) -> str:
    """One table: a row per evaluated model, a column per figure."""
    keys = [
        "eval/exact_match",
        "eval/completed",
        "eval/accuracy",
        "eval/reward_mean",
        "eval/prompts",
    ]
    if any("eval/pass_at_k" in m for m in rows.values()):
        keys.append("eval/pass_at_k")
    if any(UNSEEN + "exact_match" in m for m in rows.values()):
        keys.append(UNSEEN + "exact_match")
    width = max(len(name) for name in rows) + 2
    names = ["unseen_exact" if k.startswith(UNSEEN) else k.split("/", 1)[1] for k in keys]
    header = f"{'model':<{width}}" + "".join(f"{name:>14}" for name in names)
    lines = [header, "-" * len(header)]
    for name, metrics in rows.items():
        lines.append(
            f"{name:<{width}}" + "".join(f"{metrics.get(k, float('nan')):>14.3f}" for k in keys)
        )
    return "\n".join(lines)


class EvalError(ValueError):
    """A model, run or data source that cannot be evaluated; the message is one line."""


def job_for(overrides: list[str]) -> str | None:
    """The job whose settings ``streamrl eval`` gives a model (not a run directory): the
    shipped job of the task that ``eval.source`` names, if there is one (``--data countdown``:
    ``configs/countdown.yaml``, with its token limit, verifiers and task knobs), else the
    default job."""
    from streamrl.config import default_config_path, parse_overrides, shipped_config

    source = dict(parse_overrides(overrides)).get("eval.source")
    job = shipped_config(source) if isinstance(source, str) and source in TASKS else None
    return str(job) if job is not None else default_config_path()


def resolve_target(target: str, overrides: list[str]) -> tuple[str, Config, Any]:
    """(label, config, model directory) for a run directory, an HF directory or a name (the
    latter two with ``job_for``'s settings)."""
    from pathlib import Path

    from streamrl.config import ConfigError, load_config
    from streamrl.models import ModelNotFoundError, resolve_model

    path = Path(target)
    try:
        if (path / "config.yaml").is_file():  # a run directory: its settings, its final model
            if not (path / "hf" / "config.json").is_file():
                raise EvalError(f"{target}: the run has no exported model (hf/) yet")
            return target, load_config(path / "config.yaml", overrides), path / "hf"
        config = load_config(job_for(overrides), overrides)
        return target, config, resolve_model(target, revision=config.model.revision)
    except (ConfigError, ModelNotFoundError) as exc:
        raise EvalError(str(exc)) from None


def evaluates_in_slack(config: Config) -> bool:
    """Whether ``eval.runs_on`` puts the run's evaluations in generator 0's evaluation
    process (``workers.generation.eval_process``) rather than its loop: ``auto`` does on
    CPU generators."""
    runs_on = config.eval.runs_on
    return runs_on == "slack" or (runs_on == "auto" and config.generator.device == "cpu")
