"""What a run writes about itself: the per-step record (``metrics.jsonl``), the summary
(``summary.json``) and the console's closing lines, all read from the run's state.

Pure functions of their arguments: the controller calls them, tests can too.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, TextIO

from streamrl.checkpoint_layout import checkpoints_root, is_complete, path_for
from streamrl.controller.generation_yield import GenerationYield, generation_yield
from streamrl.controller.state import RunState
from streamrl.protocol import (
    WEIGHT_STAGES,
    EvalReport,
    GeneratorActivity,
    GeneratorReport,
    LearnerStep,
)

OUTCOME_KEYS = (
    "eval/success",  # multi-turn episodes: with eval/turns and the environment's counts
    "eval/turns",
    "eval/tool_calls",
    "eval/exact_match",
    "eval/completed",
    "eval/accuracy",
    "eval/reward_mean",
    "eval/unseen_phrasing/exact_match",  # when the first and last evaluations both asked it
)


def step_record(state: RunState, step: LearnerStep, tokens_per_s: float) -> dict[str, Any]:
    """One line of ``metrics.jsonl``: the learner's metrics and the roles' figures now."""
    gens = list(state.generators.values())  # live ones
    every = state.all_generator_reports()  # and ended incarnations, for totals
    return {
        "step": step.version,
        "epoch": step.incarnation,  # the learner clock's: a restart repeats step numbers
        "time": step.time,
        **step.metrics,
        "throughput/tokens_per_s": tokens_per_s,
        "buffer/size": sum(s.size for s in state.shards.values()),
        "buffer/dropped": state.buffer_dropped(),
        "generators/min_version": min((g.applied_version for g in gens), default=0),
        "generators/max_version": max((g.applied_version for g in gens), default=0),
        "weights/publish_to_applied_s_max": max((g.weights_latency_s for g in gens), default=0.0),
        "weights/anchors_requested": sum(g.anchors_requested for g in gens),
        "weights/apply_s_max": max((g.weights_apply_s for g in gens), default=0.0),
        # Publish -> adopted split by stage (WeightStages), each the slowest generator's.
        **{
            f"weights/stage_{stage}_s_max": max(
                (getattr(g.weights_stages, f"{stage}_s") for g in gens), default=0.0
            )
            for stage in WEIGHT_STAGES
        },
        "weights/checksum_failures": sum(g.checksum_failures for g in gens),
        # Whole-image checks (weights.verify_every), over replaced generators too.
        "weights/images_verified": sum(g.images_verified for g in every),
        "weights/image_mismatches": sum(g.image_mismatches for g in every),
        # Cumulative over generators, for rates over any window (`streamrl bench`).
        "generators/count": len(gens),
        "generators/restarts": sum(
            n for role, n in state.restarts.items() if role.startswith("generator ")
        ),
        "generators/reward_errors_total": sum(g.reward_errors for g in every),
        "generators/reward_timeouts_total": sum(g.reward_timeouts for g in every),
        **{f"episodes/{k}_total": v for k, v in episode_totals(every)["ended"].items()},
        "generators/tokens_total": sum(g.tokens_generated for g in every),
        "generators/groups_total": sum(g.groups_pushed for g in every),
        "generators/weights_bytes_total": sum(g.weights_bytes_received for g in every),
        **{
            f"generators/{name}_total": sum(getattr(g.activity, name) for g in every)
            for name in GeneratorActivity.__struct_fields__
        },
        **scoring_record(state, gens),
        **run_yield(state).record(),
    }


def run_yield(state: RunState) -> GenerationYield:
    """How much of the run's generation ended in a gradient (``generation_yield``)."""
    return generation_yield(state.all_generator_reports(), list(state.shards.values()))


def scoring_record(state: RunState, gens: list[GeneratorReport]) -> dict[str, float]:
    """Served rewards' figures in a step record (none without them): groups waiting for
    scores now, and per reward role its current incarnation's totals (busy and up seconds,
    requests, summed queue wait) for rates over any window (``streamrl bench``)."""
    if not state.reward_roles:
        return {}
    out: dict[str, float] = {"scoring/waiting": sum(g.scoring.waiting for g in gens)}
    for r in state.reward_roles.values():
        prefix = f"scoring/{r.label}"
        out[f"{prefix}/busy_s_total"] = r.busy_s
        out[f"{prefix}/up_s_total"] = r.up_s
        out[f"{prefix}/requests_total"] = r.requests
        out[f"{prefix}/queue_wait_s_total"] = r.queue_wait_s
        out[f"{prefix}/latency_p95_s"] = r.latency_p95_s
    return out


def run_summary(
    state: RunState,
    *,
    durable: bool,
    rolled_back: int,
    ignored_reports: dict[str, int],
    evals: list[EvalReport],
    run_dir: Path,
    wall_time_s: float,
    stopped_because: str = "",
    best_metric: str = "eval/completed",
    model_version: int | None = None,
) -> dict[str, Any]:
    """``summary.json``: where the run ended, and every group accounted for.
    ``stopped_because``: why it ended before ``run.max_steps`` by a stop rule
    (``controller.stopping``), "" otherwise; ``best_metric``: the metric the best version
    is chosen by (``best_evaluation``); ``model_version``: the version ``hf/`` holds when
    ``keep_best`` put an earlier one there (None: the last)."""
    gens = {
        g.generator_id: {
            "applied_version": g.applied_version,
            "verified_versions": g.verified_versions,
            "checksum_failures": g.checksum_failures,
            "images_verified": g.images_verified,
            "image_mismatches": g.image_mismatches,
            "anchors_applied": g.anchors_applied,
            "reward_errors": g.reward_errors,
            "reward_timeouts": g.reward_timeouts,
            "episode_ends": dict(g.episode_ends),
            "episode_errors": dict(g.episode_errors),
        }
        for g in state.generators.values()
    }
    shards = sorted(state.shards.values(), key=lambda s: s.shard_id)
    return {
        "version": state.version,
        "generators": gens,
        # Multi-turn episodes by how they ended, and those ended in error by reason, over
        # every generator process of the run (replaced ones too).
        "episodes": episode_totals(state.all_generator_reports()),
        "restarts": dict(state.restarts),
        # Per shard: accepted = consumed + dropped (by reason) + size + held, exactly.
        "buffer": [
            {
                "shard_id": s.shard_id,
                "ingested": s.ingested,
                "consumed": s.consumed,
                "dropped": dict(s.dropped),
                "size": s.size,
                "held": s.held,
                # Durable shards, from the log, over every process that served the shard:
                # received_total == sum(removed_total) + size + held.
                "received_total": s.received_total,
                "removed_total": dict(s.removed_total),
                "recovered": s.recovered,
                # Groups generators sent again after a restart that the log had already.
                "resent_duplicates": s.resent_duplicates,
                # Batch requests answered again with the same groups (a lost reply).
                "retried_takes": s.retried_takes,
                # Refused at the door (would poison a learner), by reason.
                "invalid": dict(s.invalid),
            }
            for s in shards
        ],
        # Consumed by learner steps that a learner restart took back (trained again on new
        # groups): handed out once, trained on by no surviving version.
        "groups_rolled_back": rolled_back,
        # Pushed by generators and never received by a shard; durable shards only, else null.
        # Generators send a restarted shard what it had not acknowledged again, and wait for
        # receipts before leaving (buffers.delivery), so this is 0 unless a shard stayed down.
        "groups_lost_in_transit": (
            sum(g.groups_pushed for g in state.all_generator_reports())
            - sum(s.received_total for s in shards)
            if durable
            else None
        ),
        # Learner reports not taken: a replaced group's late ones, versions out of range.
        "ignored_reports": ignored_reports,
        "run_dir": str(run_dir),
        "wall_time_s": wall_time_s,
        "stopped_because": stopped_because,
        "best": best_evaluation([e for e in evals if state.eval_is_live(e)], best_metric, run_dir),
        # The version the run's model (hf/) holds: the last, or the best with eval.keep_best.
        "model_version": state.version if model_version is None else model_version,
        # data.sampler: difficulty: fresh prompts passed over, and the questions it scored.
        "sampler": state.difficulty.summary() if state.difficulty is not None else None,
        # Evaluations of weights still on the timeline (a learner restart takes later ones
        # back), with the learner epoch of the weights each one evaluated.
        "eval": [
            {"requested": e.requested, "version": e.version, "epoch": e.weights_epoch, **e.metrics}
            for e in evals
            if state.eval_is_live(e)
        ],
        # Served rewards (docs/design.md §7c): each reward role's figures, and the generators'.
        "scoring": scoring_figures(state),
        # Policy tokens generated, the share that ended in a gradient, the rest by why.
        "generation": run_yield(state).summary(),
    }


def scoring_figures(state: RunState) -> dict[str, Any]:
    """Each reward role's latency, queue and failures (its current incarnation's totals;
    ``restarts`` counts the ones before), and the generators' side summed over every
    generator process: groups waiting now, retries, timeouts, refusals, duplicate replies,
    unparsable scores per scorer."""
    roles = []
    for index, r in sorted(state.reward_roles.items()):
        roles.append(
            {
                "index": index,
                "label": r.label,
                "identity": r.identity,
                "incarnation": r.incarnation,
                "requests": r.requests,
                "items": r.items,
                "batches": r.batches,
                "busy_fraction": r.busy_s / r.up_s if r.up_s > 0 else 0.0,
                "queue_depth": r.queue_depth,
                "queue_wait_mean_s": r.queue_wait_s / r.requests if r.requests else 0.0,
                "latency_p50_s": r.latency_p50_s,
                "latency_p95_s": r.latency_p95_s,
                "failures": r.failures,
                "unparsable": r.unparsable,
                "malformed": r.malformed,
                "expired": r.expired,
                "replaced": r.replaced,
                "quarantined": r.quarantined,
                "restarts": state.restarts.get(f"reward role {index}", 0),
            }
        )
    reports = state.all_generator_reports()
    totals: dict[str, Any] = {
        key: sum(getattr(g.scoring, key) for g in reports)
        for key in ("sent", "retries", "timeouts", "refused", "teacher_lagged", "duplicates")
    }
    totals["waiting"] = sum(g.scoring.waiting for g in state.generators.values())
    unparsable: dict[str, int] = {}
    for g in reports:
        for label, n in g.scoring.unparsable.items():
            unparsable[label] = unparsable.get(label, 0) + n
    totals["unparsable"] = unparsable
    scored = sum(g.groups_pushed for g in reports) if roles else 0
    wait = sum(g.scoring.wait_s for g in reports)
    totals["wait_mean_s"] = wait / scored if scored else 0.0
    return {"roles": roles, "generators": totals}


def best_evaluation(evals: list[EvalReport], metric: str, run_dir: Path) -> dict | None:
    """The evaluation with the highest ``metric`` (the earliest of equals): its version, the
    value, and the checkpoint that holds those weights (None when none was saved at that
    version: ``run.checkpoint_every`` a divisor of ``eval.every`` keeps one for each). None
    when no evaluation reported ``metric``."""
    scored = [e for e in evals if metric in e.metrics]
    if not scored:
        return None
    best = max(scored, key=lambda e: (e.metrics[metric], -e.version))
    checkpoint = path_for(checkpoints_root(run_dir), best.version)
    return {
        "metric": metric,
        "value": best.metrics[metric],
        "version": best.version,
        "checkpoint": str(checkpoint) if is_complete(checkpoint) else None,
    }


def keep_best(evals: list[EvalReport], metric: str, run_dir: Path, console: TextIO) -> int | None:
    """``eval.keep_best``: when the best of ``evals`` (live, in ``metric``) is not the last,
    export its checkpoint as the run's model (``export.keep_best_version``). The version
    ``hf/`` then holds, or None when it holds the last (the last was best, or the best
    version's checkpoint could not be exported: said on ``console``)."""
    from streamrl.export import keep_best_version

    best = best_evaluation(evals, metric, run_dir)
    last = max(evals, key=lambda e: e.version, default=None)
    if best is None or last is None or last.metrics.get(metric, -math.inf) >= best["value"]:
        return None  # the last version is as good as any: it stays
    try:
        keep_best_version(run_dir, best["version"])
    except Exception as exc:  # the run's own model stays; the run is not lost over this
        line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"eval.keep_best: hf/ keeps the last version: {line}", file=console, flush=True)
        return None
    return best["version"]


def outcome(summary: dict[str, Any]) -> str:
    """The answer to "did my model get better?": held-out eval before and after."""
    lines = [f"wall time {summary['wall_time_s']:.0f} s, {summary['version']} steps"]
    evals = summary["eval"]
    if evals:
        first, last = evals[0], evals[-1]
        for key in OUTCOME_KEYS:
            if key not in first or key not in last:
                continue
            lines.append(
                f"{key:<18} {first[key]:.3f} (version {first['version']}) -> "
                f"{last[key]:.3f} (version {last['version']})"
            )
    best = summary.get("best")
    kept = summary.get("model_version", summary["version"])
    if best and kept == best["version"] != summary["version"]:
        lines.append(
            f"hf/ holds version {kept}, the best {best['metric']} {best['value']:.3f} "
            f"(eval.keep_best); the last version's model is in hf-last/"
        )
    elif best and evals and best["version"] != evals[-1]["version"]:
        # The run ended below its best: say where the best weights are.
        where = (
            f"streamrl export {summary['run_dir']} --step {best['version']} --out DIR"
            if best["checkpoint"]
            else "no checkpoint holds it (run.checkpoint_every)"
        )
        lines.append(
            f"best {best['metric']} {best['value']:.3f} at version {best['version']}: {where}"
        )
    generation = summary.get("generation") or {}
    if generation.get("tokens"):
        lost = ", ".join(
            f"{why.replace('_', ' ')} {100 * share:.0f}%"
            for why, share in generation["lost"].items()
            if share >= 0.005
        )
        guided = generation.get("groups_guided", 0)
        early = generation.get("groups_settled_early", 0)
        lines.append(
            f"useful generation {100 * generation['useful']:.0f}% of {generation['tokens']} "
            f"tokens"
            + (f" (lost: {lost})" if lost else "")
            + (f"; {guided} groups trained on a reference response" if guided else "")
            + (
                f"; {early} groups settled by their first samples "
                f"({generation.get('samples_spared', 0)} samples spared)"
                if early
                else ""
            )
        )
    return "\n".join(lines)


def episode_totals(reports: list[GeneratorReport]) -> dict[str, dict[str, int]]:
    """How the reports' episodes ended (``ended``: by finish reason; ``errors``: those ended
    in error, by reason), summed."""
    ended: dict[str, int] = {}
    errors: dict[str, int] = {}
    for report in reports:
        for key, n in report.episode_ends.items():
            ended[key] = ended.get(key, 0) + n
        for key, n in report.episode_errors.items():
            errors[key] = errors.get(key, 0) + n
    return {"ended": ended, "errors": errors}
