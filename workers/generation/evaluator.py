"""Held-out evaluation on an engine: generator 0's between its calls, and ``streamrl eval``'s.

What is evaluated and how it is scored is ``streamrl.evaluation``'s (torch-free, and below the
workers, so the generator and this module import it and it imports neither). This module
drives an engine: it prompts the held-out set exactly as training prompts
(``models.encode_prompt``), decodes it ``eval.samples`` times per prompt with the engine's
current weights, and hands the responses to ``evaluation.score``.

Example: ``evaluate(engine, tokenizer, config).metrics["eval/exact_match"]`` is the share of
responses whose first line states the ground truth.
"""

from __future__ import annotations

import time

from streamrl.config import Config
from streamrl.data import Prompt
from streamrl.evaluation import (
    UNSEEN,
    EvalResult,
    eval_prompts,
    score,
    unseen_phrasing_prompts,
)
from streamrl.models import encode_prompt, stop_token_ids
from streamrl.workers.engines.base import Engine, SamplingParams, StepHook

# Rows per engine call when a step hook may pause the evaluation (the evaluation process's
# gate): one call's prefill runs to its end however long the hook would have waited. The
# default job's 128 held-out prompts took 4.1 s of one EPYC core in calls of 16 rows, 3.0 s
# in calls of 64 (2.96 s in one call); a 64-row prefill is 0.6 s.
HOOKED_CALL_ROWS = 64


def evaluate(
    engine: Engine,
    tokenizer,
    config: Config,
    prompts: list[Prompt] | None = None,
    on_step: StepHook | None = None,
) -> EvalResult:
    """Decode the held-out prompts with ``engine`` (its current weights) and score them;
    ``on_step`` runs between decode steps (the evaluation process waits there for slack)."""
    ev = config.eval
    prompts = eval_prompts(config) if prompts is None else prompts
    params = SamplingParams(
        temperature=ev.temperature,
        max_new_tokens=ev.max_new_tokens or config.generator.max_new_tokens,
        stop_token_ids=stop_token_ids(tokenizer),
    )
    if config.env.name:
        return evaluate_episodes(engine, tokenizer, config, prompts, params)
    ids = [encode_prompt(tokenizer, p, config.data.max_prompt_tokens) for p in prompts]
    batch = [prompt_ids for prompt_ids in ids for _ in range(ev.samples)]
    if on_step is None:
        outputs = engine.generate(batch, params)
    else:  # in calls of a few rows: a prefill holds the engine past the hook for its length
        outputs = []
        for start in range(0, len(batch), HOOKED_CALL_ROWS):
            on_step(engine)
            outputs += engine.generate(batch[start : start + HOOKED_CALL_ROWS], params, on_step)
    responses = [
        (
            tokenizer.decode(out.response_ids, skip_special_tokens=True),
            out.response_ids,
            out.finish_reason,
        )
        for out in outputs
    ]
    return score(config, prompts, responses, engine.version)


def evaluate_held_out(
    engine: Engine,
    tokenizer,
    config: Config,
    prompts: list[Prompt],
    unseen: bool,
    on_step: StepHook | None = None,
) -> EvalResult:
    """A run's evaluation (generator 0's or its evaluation process's): ``evaluate``, the
    unseen wording too when ``unseen`` (the first and the final one), and ``eval/seconds``."""
    start = time.monotonic()
    result = evaluate(engine, tokenizer, config, prompts, on_step)
    if unseen:
        add_unseen_phrasing(result, engine, tokenizer, config, on_step)
    result.metrics["eval/seconds"] = time.monotonic() - start
    return result


def evaluate_episodes(
    engine: Engine, tokenizer, config: Config, prompts: list[Prompt], params: SamplingParams
) -> EvalResult:
    """The held-out prompts played as episodes with the job's environment: ``eval/success``
    (the environment's verdict), ``eval/turns`` (policy turns per episode), the share of each
    way episodes ended (``eval/ended/<finish reason>``) and the environment's counts per
    episode (``eval/<count>``, e.g. ``eval/tool_calls``). ``eval/exact_match`` is the success
    rate and ``eval/completed`` the share solved that ended normally, so that the console,
    the bench and ``streamrl eval`` read an episode job's figures as any other's."""
    from streamrl.workers.generation.episodes import EpisodeRunner

    runner = EpisodeRunner(config, tokenizer)
    try:
        episodes = runner.play(engine, prompts, config.eval.samples, params, count=False)
    finally:
        runner.close()
    n = max(len(episodes), 1)
    success = sum(e.success for e in episodes) / n
    metrics = {
        "eval/success": success,
        "eval/exact_match": success,
        "eval/completed": sum(e.success and e.finish_reason == "stop" for e in episodes) / n,
        "eval/accuracy": success,
        "eval/reward_mean": sum(e.reward for e in episodes) / n,
        "eval/turns": sum(e.turns for e in episodes) / n,
        "eval/prompts": float(len(prompts)),
        "eval/version": float(engine.version),
    }
    for reason in sorted({e.finish_reason for e in episodes}):
        metrics[f"eval/ended/{reason}"] = sum(e.finish_reason == reason for e in episodes) / n
    for name in sorted({name for e in episodes for name in e.counts}):
        metrics[f"eval/{name}"] = sum(e.counts.get(name, 0.0) for e in episodes) / n
    samples = [
        {
            "prompt_id": e.prompt.prompt_id,
            "response": runner.text(e),
            "ground_truth": e.prompt.ground_truth,
            "reward": e.reward,
            "exact": e.success,
            "stopped": e.finish_reason == "stop",
            "turns": e.turns,
            "finish_reason": e.finish_reason,
            "end_reason": e.end_reason,
        }
        for e in episodes
    ]
    return EvalResult(engine.version, metrics, samples)


def add_unseen_phrasing(
    result: EvalResult,
    engine: Engine,
    tokenizer,
    config: Config,
    on_step: StepHook | None = None,
) -> None:
    """Ask the same held-out questions in the wording training never uses
    (``evaluation.unseen_phrasing_prompts``) and add their figures to ``result`` under
    ``eval/unseen_phrasing/``; nothing when there is no such wording."""
    unseen = unseen_phrasing_prompts(config)
    if unseen:
        other = evaluate(engine, tokenizer, config, unseen, on_step)
        for key, value in other.metrics.items():
            result.metrics[UNSEEN + key.removeprefix("eval/")] = value


def run_cli_eval(
    targets: list[str], data: str | None, max_prompts: int | None, device: str, out: str
) -> int:
    """``streamrl eval``: evaluate each target greedily, print one table, write JSON."""
    import json

    import msgspec

    from streamrl.data import DataError
    from streamrl.evaluation import EvalError, format_table, resolve_target
    from streamrl.hardware import resolve_compute_dtype
    from streamrl.models import load_tokenizer
    from streamrl.workers.engines.base import EngineArgs
    from streamrl.workers.engines.hf import HFEngine

    overrides = [f"eval.source={data}"] if data else []
    overrides += [f"eval.max_prompts={max_prompts}"] if max_prompts else []
    rows, results = {}, {}
    for target in targets:
        label, config, model_dir = resolve_target(target, overrides)
        try:
            prompts = eval_prompts(config)
        except DataError as exc:
            raise EvalError(str(exc)) from None
        dtype = resolve_compute_dtype(config.model.compute_dtype, device)
        engine = HFEngine(EngineArgs(model_dir, device=device, dtype=dtype, seed=config.run.seed))
        tokenizer = load_tokenizer(model_dir)
        result = evaluate(engine, tokenizer, config, prompts)
        add_unseen_phrasing(result, engine, tokenizer, config)
        rows[label] = result.metrics
        results[label] = msgspec.to_builtins(result)
    print(format_table(rows))
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {out}")
    return 0
