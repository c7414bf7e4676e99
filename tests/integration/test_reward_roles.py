"""Served rewards in real runs (docs/design.md §7c): a judge and a reward model, each in a
reward role of its own, scoring the tiny job's groups beside a rule; every group scored once,
with the scorer's identity; the weighted, normalised reward as computed by hand from the
logged parts; the evaluation's model reward beside its exact check."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from support import (
    ONE_GENERATOR,
    ONE_LEARNER,
    ONE_OF_EACH,
    assert_nothing_lost,
    finish_run,
    killed_on_error,
    launch_tiny,
)

from streamrl.buffers.log_history import scan_shard, shard_dirs
from streamrl.protocol import unpack_float32

pytestmark = pytest.mark.slow

RULE = "{name: target_token_share, args: {token_id: 27}}"
JUDGE = (
    "{judge: {model: tiny-random-llama, template: 'Q {prompt} A {response} ok?', "
    "yes_tokens: ['1'], no_tokens: ['0'], min_verdict_mass: 0.0}, weight: 0.5, "
    "normalize: group}"
)
MODEL = "{model: tiny-random-reward, label: rm}"


def _run(tmp_path: Path, rewards: str, *more: str) -> tuple[str, dict, Path]:
    run_dir = tmp_path / "run"
    proc = launch_tiny(
        run_dir,
        f"rewards=[{rewards}]",
        "run.max_steps=4",
        "eval.every=2",
        "eval.max_prompts=8",
        *more,
    )
    with killed_on_error(proc):
        out, summary = finish_run(proc, run_dir)
    return out, summary, run_dir


def _logged(run_dir: Path) -> list:
    return [g for shard in shard_dirs(run_dir / "buffer") for g, _ in scan_shard(shard)]


def test_a_judge_beside_a_rule_scores_every_group_once_and_weights_them(tmp_path: Path) -> None:
    out, summary, run_dir = _run(tmp_path, f"{RULE}, {JUDGE}", *ONE_LEARNER)  # two generators
    assert summary["version"] == 4
    (role,) = summary["scoring"]["roles"]
    assert role["label"] == "judge-tiny-random-llama" and role["failures"] == 0
    assert role["requests"] > 0 and role["items"] >= 4 * len(_logged(run_dir))
    generators = summary["scoring"]["generators"]
    assert generators["refused"] == 0 and generators["waiting"] == 0
    groups = _logged(run_dir)
    assert groups
    for group in groups:
        assert group.scorers == [role["identity"]]  # scored once, by these weights
        rule = [t.reward_parts[0] for t in group.trajectories]
        judge = [t.reward_parts[1] for t in group.trajectories]
        mean = sum(judge) / len(judge)
        std = math.sqrt(sum((j - mean) ** 2 for j in judge) / len(judge))
        for t, r, j in zip(group.trajectories, rule, judge, strict=True):
            normalised = (j - mean) / std if std > 1e-6 else 0.0
            assert t.reward == pytest.approx(r + 0.5 * normalised, abs=1e-9)
            assert 0.0 <= j <= 1.0
    evals = summary["eval"]
    assert all("eval/reward/judge-tiny-random-llama" in e for e in evals), evals
    assert_nothing_lost(summary, run_dir)


def test_a_reward_model_alone_scores_a_real_run(tmp_path: Path) -> None:
    """The RLHF shape: the reward model's score is the reward (no rule beside it)."""
    out, summary, run_dir = _run(tmp_path, MODEL, *ONE_OF_EACH)
    assert summary["version"] == 4
    (role,) = summary["scoring"]["roles"]
    assert role["label"] == "rm" and role["identity"].startswith("rm@")
    assert role["unparsable"] == 0 and role["failures"] == 0
    groups = _logged(run_dir)
    assert groups
    for group in groups:
        assert group.scorers == [role["identity"]]
        for t in group.trajectories:
            assert math.isfinite(t.reward) and t.reward == t.reward_parts[0]
    assert len({t.reward for g in groups for t in g.trajectories}) > 1  # scores, not zeros
    assert all("eval/reward/rm" in e and "eval/accuracy" not in e for e in summary["eval"])
    assert_nothing_lost(summary, run_dir)


ENGINES = {
    "hf": [*ONE_OF_EACH],
    "vllm": [
        *ONE_OF_EACH,
        "generator.engine=vllm",
        "model.tiny_hidden=128",
        "generator.engine_options.kv_cache_mb=64",
        # The evaluation's own vLLM engine would start beside the generator's; that the
        # teacher never sees an evaluation is checked on the HF engine.
        "eval.every=0",
    ],
}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_teacher_beside_a_rule_gives_every_token_its_logprob(tmp_path: Path, engine: str) -> None:
    """On-policy distillation in a real run (docs/design.md §7d), on the HF engine and on
    vLLM: a teacher role (a tiny model with the student's tokenizer) answers every group once
    with one logprob per response token; the reward is the rule's alone (a teacher weighs 0
    in it), the teacher's part is the sampled reverse KL, its top-k tokens travel with every
    response token, flat-reward groups are kept for the teacher's term, and the learner logs
    both terms; the evaluation is not sent to the teacher."""
    if engine == "vllm":
        pytest.importorskip("vllm")
    teacher = "{teacher: {model: tiny-random-llama, top_k: 4}, weight: 0.5}"
    out, summary, run_dir = _run(
        tmp_path, f"{RULE}, {teacher}", "buffer.drop_zero_variance=true", *ENGINES[engine]
    )
    assert summary["version"] == 4
    (role,) = summary["scoring"]["roles"]
    assert role["label"] == "teacher-tiny-random-llama" and role["failures"] == 0
    assert summary["scoring"]["generators"]["refused"] == 0
    groups = _logged(run_dir)
    assert groups
    for group in groups:
        assert group.scorers == [role["identity"]] and group.distilled
        for t in group.trajectories:
            assert t.check() is None and t.teacher_coef == t.teacher_top_coef == 0.5
            assert len(t.teacher_logprobs) == len(t.response_ids)
            assert len(t.teacher_top_ids) == len(t.teacher_top_logprobs) == 4 * len(t.response_ids)
            assert t.reward == t.reward_parts[0]  # the rule's score alone
            teacher = unpack_float32(t.teacher_logprobs)
            behaviour = t.logprob_list()
            if teacher:
                kl = sum(b - s for b, s in zip(behaviour, teacher, strict=True)) / len(teacher)
                assert t.reward_parts[1] == pytest.approx(kl, abs=1e-5)
    assert all(s["dropped"]["zero_variance"] == 0 for s in summary["buffer"]), summary["buffer"]
    metrics = [line for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any('"distill/reverse_kl"' in line for line in metrics)
    assert any('"distill/forward_kl_top_k"' in line for line in metrics)
    if engine == "hf":
        assert summary["eval"] and all(
            "eval/reward/teacher-tiny-random-llama" not in e for e in summary["eval"]
        )
    assert_nothing_lost(summary, run_dir)


STUDENTS = {
    "full": [*ONE_OF_EACH],
    # Two learner ranks: the copy merges adapters streamed from both.
    "lora": [
        *ONE_GENERATOR,
        "model.lora={r: 4, alpha: 8, target_modules: [q_proj, v_proj, down_proj]}",
    ],
}


@pytest.mark.parametrize("student", STUDENTS)
def test_a_lagged_copy_of_the_student_teaches_with_the_version_it_names(
    tmp_path: Path, student: str
) -> None:
    """Self-distillation (``teacher: {model: self, refresh_every: 2}``, docs/design.md §7d):
    the teacher role follows the learners' weight stream two versions at a time (with LoRA,
    merging the streamed adapters as a generator does). Every scored group names the
    teacher's version (a multiple of 2, within the lag bound of the group), the teacher moves
    past version 0, and where the copy is the very version that sampled a group it gives the
    sampled tokens the student's own logprobs (the reverse KL is rounding): the copy holds
    exactly the weights it names. The learner logs the lag."""
    teacher = "{teacher: {model: self, refresh_every: 2}, weight: 0.5}"
    out, summary, run_dir = _run(
        tmp_path,
        f"{RULE}, {teacher}",
        "run.max_steps=6",
        "eval.every=0",  # nothing here is about the evaluation, which a process of its own runs
        *STUDENTS[student],
    )
    assert summary["version"] == 6
    (role,) = summary["scoring"]["roles"]
    assert role["label"] == "teacher-self" and role["failures"] == 0
    generators = summary["scoring"]["generators"]
    assert generators["refused"] == generators["teacher_lagged"]  # no other refusal
    groups = _logged(run_dir)
    scored = [g for g in groups if not g.unscored]
    assert scored
    versions = {t.teacher_version for g in scored for t in g.trajectories}
    assert all(v >= 0 and v % 2 == 0 for v in versions) and max(versions) >= 2, versions
    same, behind = [], []  # |teacher - behaviour| per token: copy at / behind the sampler
    for group in scored:
        held = group.trajectories[0].teacher_version
        assert group.max_version - held <= 4  # the default bound, twice refresh_every
        if group.min_version == group.max_version:
            for t in group.trajectories:
                teacher, behaviour = unpack_float32(t.teacher_logprobs), t.logprob_list()
                gaps = [abs(a - b) for a, b in zip(teacher, behaviour, strict=True)]
                (same if held == group.max_version else behind).extend(gaps)
    mean_same = sum(same) / max(len(same), 1)
    assert same and mean_same < 0.01, mean_same  # measured: 0.0 (float32 tiny model)
    if behind:  # measured 0.04 a token one version behind: the copy is not the sampler's
        assert sum(behind) / len(behind) > mean_same
    metrics = (run_dir / "metrics.jsonl").read_text()
    assert '"distill/teacher_lag"' in metrics and '"distill/teacher_lag_max"' in metrics
    assert_nothing_lost(summary, run_dir)
