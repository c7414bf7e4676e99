"""On-policy distillation's parts (docs/design.md §7d): the teacher scorer's per-token
logprobs, the generator's combination of several teachers, the learner's per-token advantage,
and the refusals of a teacher that cannot teach this student."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from streamrl.algorithms.advantages import distill
from streamrl.config import ConfigError, load_config
from streamrl.controller.preflight import _check_scoring_device, _check_teachers
from streamrl.models import TINY, load_causal_lm, resolve_model
from streamrl.models.store import ModelNotFoundError
from streamrl.protocol import (
    Trajectory,
    TrajectoryGroup,
    pack_float32,
    pack_int32,
    unpack_float32,
    unpack_int32,
)
from streamrl.rewards.distill import attach_teachers, check_answer
from streamrl.rewards.scorer import ScoreItem
from streamrl.workers.learning.batching import build_micro_batches
from streamrl.workers.reward_roles.teacher import TeacherScorer

ROOT = Path(__file__).resolve().parents[2]


def _item(prompt: list[int], response: list[int], temperature: float = 1.0) -> ScoreItem:
    return ScoreItem("q", "", "", pack_int32(prompt), pack_int32(response), temperature)


@pytest.fixture(scope="module")
def teacher() -> TeacherScorer:
    return TeacherScorer(resolve_model(TINY), "teacher-tiny")


@torch.no_grad()
def _alone(model, prompt: list[int], response: list[int], temperature: float) -> list[float]:
    """The response's logprobs from a forward of its sequence alone (no padding)."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    logprobs = torch.log_softmax(logits, -1)
    return logprobs.gather(-1, torch.tensor(response)[:, None])[:, 0].tolist()


@pytest.mark.parametrize("shared", [True, False])
def test_the_teacher_gives_each_response_token_its_logprob_as_alone(teacher, shared) -> None:
    """Responses of different lengths, several to one prompt, score in one batch as each
    does alone, at its own temperature, whether a prompt's responses share one row
    (``shared_rows``) or each has its own left-padded row; an empty response gets an empty
    array."""
    assert teacher.share_prompts  # the tiny llama takes a 4-D mask
    reference = load_causal_lm(resolve_model(TINY), dtype="float32").eval()
    cases = [
        ([5, 6, 7], [8, 9], 1.0),
        ([5], [10, 11, 12, 13, 14], 1.0),
        ([5, 6, 7], [12], 1.0),
        ([20, 21, 22, 23, 24, 25], [26], 0.7),
        ([30, 31], [], 1.0),
        ([40, 41], [42, 43, 44], 0.7),
        ([5, 6, 7], [8, 10, 11], 1.0),
        ([40, 41], [45], 0.7),
    ]
    teacher.share_prompts = shared
    try:
        out = teacher.score([_item(p, r, t) for p, r, t in cases])
    finally:
        teacher.share_prompts = True
    assert teacher.identity.startswith("teacher-tiny@")
    for (prompt, response, temperature), answer in zip(cases, out, strict=True):
        got = unpack_float32(answer.logprobs)
        assert len(got) == len(response) and answer.top_ids == b""
        assert got == pytest.approx(_alone(reference, prompt, response, temperature), abs=1e-4)
    assert all(v < 0 for v in unpack_float32(out[0].logprobs))


def test_a_top_k_teacher_sends_its_likeliest_tokens_at_each_position() -> None:
    top = TeacherScorer(resolve_model(TINY), "teacher-tiny", top_k=3)
    (answer,) = top.score([_item([5, 6, 7], [8, 9], 0.7)])
    ids = unpack_int32(answer.top_ids)
    logprobs = unpack_float32(answer.top_logprobs)
    assert len(ids) == len(logprobs) == 6
    reference = load_causal_lm(resolve_model(TINY), dtype="float32").eval()
    with torch.no_grad():
        logits = reference(input_ids=torch.tensor([[5, 6, 7, 8, 9]])).logits[0, 2:-1] / 0.7
    expected = torch.log_softmax(logits.float(), -1).topk(3, dim=-1)
    assert ids == expected.indices.flatten().tolist()
    assert logprobs == pytest.approx(expected.values.flatten().tolist(), abs=1e-4)
    chosen = unpack_float32(answer.logprobs)
    assert all(chosen[i] <= logprobs[3 * i] + 1e-6 for i in range(2))  # the top is the top
    # A sharper target: the same tokens, their logprobs at 0.7 x 0.5; the sampled token's
    # logprob (the reverse KL's) still at the sampling temperature.
    sharp = TeacherScorer(resolve_model(TINY), "teacher-tiny", top_k=3, target_tau=0.5)
    (answer,) = sharp.score([_item([5, 6, 7], [8, 9], 0.7)])
    expected = torch.log_softmax(logits.float() / 0.5, -1).topk(3, dim=-1)
    assert unpack_int32(answer.top_ids) == ids
    assert unpack_float32(answer.top_logprobs) == pytest.approx(
        expected.values.flatten().tolist(), abs=1e-4
    )
    assert unpack_float32(answer.logprobs) == pytest.approx(chosen, abs=1e-6)


def test_a_sequence_beyond_the_teachers_positions_is_refused(teacher) -> None:
    with pytest.raises(ValueError, match="positions"):
        teacher.score([_item([1] * teacher.max_tokens, [2])])


def _trajectory(behaviour: list[float], mask: list[int] | None = None) -> Trajectory:
    n = len(behaviour)
    return Trajectory.from_lists(
        [1, 2], list(range(3, 3 + n)), behaviour, [0] * n, 0.0, "stop", 0, action_mask=mask
    )


def test_two_teachers_combine_into_one_weighted_term() -> None:
    """coef * (combined - behaviour) is exactly sum_k w_k (t_k - behaviour), and each
    teacher's figure is the mean reverse KL over the policy's tokens."""
    behaviour = [-0.1, -2.0, -0.5]
    t = _trajectory(behaviour, mask=[1, 1, 0])
    first, second = [-0.2, -0.5, -1.0], [-1.0, -1.5, -0.25]
    figures = attach_teachers(
        [t], {2: (1.0, [pack_float32(first)]), 3: (0.5, [pack_float32(second)])}
    )
    assert t.teacher_coef == 1.5
    combined = unpack_float32(t.teacher_logprobs)
    for i in range(3):
        expected = 1.0 * (first[i] - behaviour[i]) + 0.5 * (second[i] - behaviour[i])
        assert t.teacher_coef * (combined[i] - behaviour[i]) == pytest.approx(expected, abs=1e-6)
    assert figures[2][0] == pytest.approx(((-0.1 + 0.2) + (-2.0 + 0.5)) / 2, abs=1e-6)
    assert figures[3][0] == pytest.approx(((-0.1 + 1.0) + (-2.0 + 1.5)) / 2, abs=1e-6)
    assert t.check() is None


def test_a_teacher_of_weight_zero_is_a_figure_only() -> None:
    t = _trajectory([-0.1, -0.2])
    attach_teachers([t], {1: (0.0, [pack_float32([-1.0, -1.0])])})
    assert t.teacher_coef == 0.0 and t.teacher_logprobs == b""


def test_an_answer_that_does_not_match_the_tokens_is_named() -> None:
    ts = [_trajectory([-0.1, -0.2]), _trajectory([-0.3])]
    assert check_answer(ts, [pack_float32([-1.0, -1.0]), pack_float32([-1.0])]) == ""
    assert "2 teacher arrays" not in check_answer(ts, [b"", b""])
    assert check_answer(ts, [pack_float32([-1.0])]) == "1 teacher arrays for 2 responses"
    assert check_answer(ts, [pack_float32([-1.0]), pack_float32([-1.0])]).startswith(
        "response 0: 1 teacher logprobs for 2 tokens"
    )
    arrays = [pack_float32([-1.0, -1.0]), pack_float32([-1.0])]
    ids = [pack_int32([1, 2, 3, 4]), pack_int32([5, 6])]
    lps = [pack_float32([-1.0] * 4), pack_float32([-1.0] * 2)]
    assert check_answer(ts, arrays, ids, lps, top_k=2) == ""
    assert check_answer(ts, arrays, ids[:1], lps, top_k=2) == "1/2 top-k arrays for 2 responses"
    assert "not k=2 per token" in check_answer(ts, arrays, ids, [lps[0], b""], top_k=2)


def test_a_distilled_group_is_kept_by_the_zero_variance_rule() -> None:
    """Flat rewards and a teacher: the group still teaches (``TrajectoryGroup.distilled``)."""
    from streamrl.buffers.replay import Offer, ReplayPolicy, ReplayStore

    class Clock:
        def current_version(self) -> int:
            return 0

        def on_timeline(self, epoch: int, max_version: int) -> bool:
            return True

    def group(gid: str, taught: bool, copy_version: int = -1) -> TrajectoryGroup:
        ts = [_trajectory([-0.5, -0.5]) for _ in range(2)]
        if taught:
            attach_teachers(ts, {1: (1.0, [pack_float32([-0.2, -0.3])] * 2)})
        for t in ts:
            t.teacher_version = copy_version
        return TrajectoryGroup(gid, "p", ts, 0.0, 0.0)

    store = ReplayStore(ReplayPolicy(capacity=8, drop_zero_variance=True), Clock())
    assert store.offer(group("flat", taught=False)) == Offer.ZERO_VARIANCE
    assert store.offer(group("taught", taught=True)) == Offer.ACCEPTED
    # A lagged copy of the student alone knows nothing new: its flat groups go as any.
    assert store.offer(group("self", taught=True, copy_version=4)) == Offer.ZERO_VARIANCE


def test_the_top_k_forward_kl_pulls_the_student_toward_the_teacher() -> None:
    """Its value is sum q (log q - log p) over the teacher's tokens; its gradient in the
    logits is (sum q) p - q there (so it is 0 where the student already is the teacher), and
    a slot without a teacher token (-inf) adds nothing, not NaN."""
    from streamrl.algorithms.losses import distill_topk, tokens_logprobs

    logits = torch.tensor([[[2.0, 0.5, -1.0, 0.0]]], requires_grad=True)
    ids = torch.tensor([[[0, 1, 3]]])
    teacher = torch.log(torch.tensor([[[0.2, 0.6, 0.1]]]))
    student = tokens_logprobs(logits, ids)
    loss = distill_topk(student, teacher).sum()
    loss.backward()
    p = torch.softmax(logits.detach(), -1)[0, 0]
    q = torch.tensor([0.2, 0.6, 0.0, 0.1])
    assert loss.item() == pytest.approx(
        float((q[[0, 1, 3]] * (q[[0, 1, 3]].log() - p[[0, 1, 3]].log())).sum()), abs=1e-6
    )
    assert logits.grad[0, 0].tolist() == pytest.approx((q.sum() * p - q).tolist(), abs=1e-6)
    same = torch.log_softmax(torch.tensor([[[1.0, 2.0, 3.0]]]), -1)
    zero = torch.tensor([[[1.0, 2.0, 3.0]]], requires_grad=True)
    distill_topk(tokens_logprobs(zero, torch.tensor([[[0, 1, 2]]])), same).sum().backward()
    assert zero.grad.abs().max().item() < 1e-6
    empty = distill_topk(torch.tensor([[[-1.0, -2.0]]]), torch.tensor([[[-0.5, -float("inf")]]]))
    assert torch.isfinite(empty).all()


def test_the_distillation_advantage_is_the_negative_sampled_reverse_kl() -> None:
    teacher = torch.tensor([[-0.2, -3.0, -1.0]])
    behaviour = torch.tensor([[-0.1, -0.5, -1.0]])
    out = distill(teacher, behaviour, torch.tensor([2.0]), torch.tensor([[1.0, 1.0, 0.0]]))
    assert out[0].tolist() == pytest.approx([-0.2, -5.0, 0.0])


def test_micro_batches_carry_the_teacher_where_a_row_has_one() -> None:
    taught = _trajectory([-0.1, -0.2])
    attach_teachers([taught], {1: (1.0, [pack_float32([-0.4, -0.8])])})
    plain = _trajectory([-0.3, -0.6, -0.9])
    (batch,) = build_micro_batches([TrajectoryGroup("g", "p", [taught, plain], 0.0, 0.0)], 8, 0)
    assert batch.teacher_coef.tolist() == [1.0, 0.0]
    assert batch.teacher[0, :2].tolist() == pytest.approx([-0.4, -0.8])
    # The untaught row's slots hold its own logprobs: its term is 0 whatever the coefficient.
    assert batch.teacher[1].tolist() == pytest.approx(batch.behavior[1].tolist())
    (none,) = build_micro_batches([TrajectoryGroup("g", "p", [plain], 0.0, 0.0)], 8, 0)
    assert none.teacher is None and none.teacher_coef is None


def _config(*overrides: str):
    return load_config(ROOT / "configs" / "tiny.yaml", list(overrides))


def test_micro_batches_carry_a_top_k_teachers_arrays() -> None:
    from streamrl.rewards.distill import attach_top_k

    taught, plain = _trajectory([-0.1, -0.2]), _trajectory([-0.3])
    attach_top_k([taught], 0.5, [pack_int32([4, 5, 6, 7])], [pack_float32([-0.1, -2, -0.3, -1])])
    assert taught.check() is None and TrajectoryGroup("g", "p", [taught], 0.0, 0.0).distilled
    (batch,) = build_micro_batches([TrajectoryGroup("g", "p", [taught, plain], 0.0, 0.0)], 8, 0)
    assert batch.teacher_top_coef.tolist() == [0.5, 0.0]
    assert batch.teacher_top_ids[0].tolist() == [[4, 5], [6, 7]]
    assert batch.teacher_top_logprobs[0].flatten().tolist() == pytest.approx([-0.1, -2, -0.3, -1])
    assert torch.isinf(batch.teacher_top_logprobs[1]).all()


def test_a_teacher_entry_is_checked_at_load() -> None:
    config = _config("rewards=[{teacher: {model: runs/t}, weight: 0.5}]")
    (reward,) = config.rewards
    assert reward.kind == "teacher" and reward.served and reward.display_name() == "teacher-t"
    assert _config("rewards=[{teacher: {model: runs/t/hf}}]").rewards[0].display_name() == (
        "teacher-t"
    )
    with pytest.raises(ConfigError, match="normalize must be none"):
        _config("rewards=[{teacher: {model: x}, normalize: group}]")
    with pytest.raises(ConfigError, match="exactly one of"):
        _config("rewards=[{teacher: {model: x}, name: numeric_match}]")
    with pytest.raises(ConfigError, match="sampled_kl false .* set top_k"):
        _config("rewards=[{teacher: {model: x, sampled_kl: false}}]")
    with pytest.raises(ConfigError, match="target_tau sharpens the top-k target: set top_k"):
        _config("rewards=[{teacher: {model: x, target_tau: 0.5}}]")
    with pytest.raises(ConfigError, match="two teachers with top_k"):
        _config("rewards=[{teacher: {model: x, top_k: 4}}, {teacher: {model: y, top_k: 4}}]")
    routed = "rewards=[{teacher: {model: x, top_k: 4, sources: [a]}}, " + (
        "{teacher: {model: y, top_k: 4, sources: [b]}}]"
    )
    assert [r.teacher.top_k for r in _config(routed).rewards] == [4, 4]


def test_a_teacher_with_another_tokenizer_is_refused_in_one_line() -> None:
    config = _config("rewards=[{teacher: {model: smollm2-135m-instruct}}]")
    student = resolve_model(TINY)
    with pytest.raises(ConfigError) as refused:
        _check_teachers(config, student, {0: str(resolve_model("smollm2-135m-instruct"))})
    message = str(refused.value)
    assert "\n" not in message and "another tokenizer" in message
    same = _config("rewards=[{teacher: {model: tiny-random-llama}}]")
    _check_teachers(same, student, {0: str(resolve_model("tiny-random-llama"))})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a device this machine lacks")
def test_a_scoring_device_that_is_not_here_is_refused() -> None:
    config = _config("rewards=[{teacher: {model: tiny-random-llama}}]", "scoring.device=cuda")
    with pytest.raises(ConfigError, match="scoring.device=cuda: no such device"):
        _check_scoring_device(config)
    _check_scoring_device(_config("rewards=[{teacher: {model: tiny-random-llama}}]"))


def test_a_run_directory_means_its_exported_model(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("run: {}\n")
    with pytest.raises(ModelNotFoundError, match="streamrl export"):
        resolve_model(str(run))
    (run / "hf").symlink_to(resolve_model(TINY), target_is_directory=True)
    assert resolve_model(str(run)) == run / "hf"


def test_mean_logprob_figures_are_finite() -> None:
    from streamrl.workers.reward_roles.reward_role import _mean_logprob

    assert _mean_logprob(pack_float32([-1.0, -3.0])) == pytest.approx(-2.0)
    assert _mean_logprob(b"") is None
    assert _mean_logprob(pack_float32([-math.inf])) is None


def test_one_pass_gives_the_sampled_and_the_top_k_logprobs_as_two_would() -> None:
    """The learner's fused call (``TrainStep._policy_logprobs``, which also takes the entropy
    from the same pass): the sampled tokens' column is ``token_logprobs`` exactly, and the
    gradient of a loss on both is the sum of each part's, at a sampling temperature."""
    from streamrl.algorithms.losses import token_logprobs, tokens_logprobs

    torch.manual_seed(0)
    logits = torch.randn(2, 3, 11, dtype=torch.float64)
    targets = torch.randint(0, 11, (2, 3))
    top = torch.randint(0, 11, (2, 3, 4))
    weights = torch.randn(2, 3, 5, dtype=torch.float64)
    fused = logits.clone().requires_grad_()
    both = tokens_logprobs(fused, torch.cat([targets[..., None], top], -1), temperature=0.7)
    (both * weights).sum().backward()
    apart = logits.clone().requires_grad_()
    sampled = token_logprobs(apart, targets, temperature=0.7)
    tops = tokens_logprobs(apart, top, temperature=0.7)
    ((sampled * weights[..., 0]).sum() + (tops * weights[..., 1:]).sum()).backward()
    assert torch.equal(both[..., 0], sampled)
    assert torch.allclose(fused.grad, apart.grad, atol=1e-12)


def test_a_teacher_run_not_made_yet_is_named_as_a_missing_directory(
    tmp_path: Path, monkeypatch
) -> None:
    """``runs/teacher`` before its run: a missing directory, not a hub id to look up."""
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFoundError, match="'runs/teacher' not found: no such directory"):
        resolve_model("runs/teacher")


def test_a_lagged_teacher_is_the_student_refreshed_every_n_versions() -> None:
    """``teacher: {model: self, refresh_every: N}``: a lagged copy of the student, its lag
    bounded by ``max_lag`` (default 2N); refresh_every without ``self`` (or ``self`` without
    it) and max_lag on a fixed teacher are refused at load."""
    config = _config("rewards=[{name: numeric_match}, {teacher: {model: self, refresh_every: 3}}]")
    reward = config.rewards[1]
    assert reward.lagged_teacher and reward.teacher.lag_bound == 6
    assert reward.display_name() == "teacher-self"
    bounded = _config("rewards=[{teacher: {model: self, refresh_every: 3, max_lag: 4}}]")
    assert bounded.rewards[0].teacher.lag_bound == 4
    assert not _config("rewards=[{teacher: {model: x}}]").rewards[0].lagged_teacher
    with pytest.raises(ConfigError, match="set refresh_every >= 1 with model: self"):
        _config("rewards=[{teacher: {model: self}}]")
    with pytest.raises(ConfigError, match="set refresh_every >= 1 with model: self"):
        _config("rewards=[{teacher: {model: x, refresh_every: 2}}]")
    with pytest.raises(ConfigError, match="max_lag bounds a lagged teacher"):
        _config("rewards=[{teacher: {model: x, max_lag: 2}}]")


def test_a_lagged_teacher_starts_from_the_policys_own_directory(tmp_path: Path) -> None:
    from streamrl.controller.reward_roles import resolve_scorer_models

    config = _config("rewards=[{name: numeric_match}, {teacher: {model: self, refresh_every: 2}}]")
    assert resolve_scorer_models(config, tmp_path) == {1: str(tmp_path.resolve())}


def test_a_teacher_path_with_no_runs_directory_yet_names_both_readings(
    tmp_path: Path, monkeypatch
) -> None:
    """``runs/teacher`` in a fresh directory (no ``runs/`` yet) reads as a hub id too: when
    the hub cannot give it, the one line also says no such directory is here."""
    import streamrl.models.resolve as resolve

    def offline(name, revision=None, weights=True):
        raise ModelNotFoundError(f"model {name!r} is not in the local HF cache")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(resolve, "hub_dir", offline)
    with pytest.raises(ModelNotFoundError) as refused:
        resolve_model("runs/teacher")
    message = str(refused.value)
    assert "no such directory under" in message and "not in the local HF cache" in message
    assert "\n" not in message


def test_a_lora_runs_adapter_teaches_as_its_merged_model(tmp_path: Path, monkeypatch) -> None:
    """A teacher from a LoRA run's ``adapter/`` (a PEFT directory naming its base): resolved
    to its base with the adapters merged in as a generator merges them, built once."""
    from streamrl.models.lora import (
        ADAPTER_FILE,
        AdapterSettings,
        LoraMerge,
        adapter_shapes,
        fresh_adapter,
        save_adapter,
    )

    monkeypatch.setenv("STREAMRL_HOME", str(tmp_path / "home"))
    base = resolve_model(TINY)
    settings = AdapterSettings(2, 4.0, ["q_proj"], 0.0)
    tensors = fresh_adapter(adapter_shapes(base, settings), seed=0)
    tensors = {n: t + 0.05 if ".lora_B." in n else t for n, t in tensors.items()}  # trained
    adapter = tmp_path / "run" / "adapter"
    adapter.mkdir(parents=True)
    save_adapter(tensors, settings, TINY, adapter)
    assert (adapter / ADAPTER_FILE).is_file()
    merged = resolve_model(str(adapter))
    assert merged != base and resolve_model(str(adapter)) == merged  # built once
    expected = dict(LoraMerge(base, tensors, settings).merged(tensors))
    params = dict(load_causal_lm(merged, dtype="bfloat16").named_parameters())
    untrained = dict(load_causal_lm(base, dtype="bfloat16").named_parameters())
    for name, weight in expected.items():  # the q_proj of every layer
        assert torch.equal(params[name].data, weight), name
        assert not torch.equal(untrained[name].data, weight), name
    config = _config(f"rewards=[{{teacher: {{model: {adapter}}}}}]")
    _check_teachers(config, base, {0: str(merged)})  # the base's tokenizer: accepted


def test_a_prompt_is_held_once_for_all_its_responses() -> None:
    """``shared_rows``' docstring example: one row, and each response's first token
    predicted from the prompt's last column."""
    from streamrl.workers.reward_roles.teacher import shared_rows

    rows = shared_rows([([1, 5], [7, 9]), ([1, 5], [8]), ([2], [3])], 0, torch.float32)
    assert rows.input_ids.tolist() == [[1, 5, 7, 9, 8], [2, 3, 0, 0, 0]]
    assert rows.keep == 5  # from column 0, the shorter prompt's last
    assert [(r, c.tolist()) for r, c in rows.where] == [(0, [1, 2]), (0, [1]), (1, [0])]
    assert rows.positions[0].tolist() == [0, 1, 2, 3, 2]  # [8] sits where [7] did


def test_a_forward_keeps_no_more_logits_than_its_budget(teacher) -> None:
    """``TOKENS_PER_FORWARD`` bounds the kept logits in either layout: in the shared one a
    prompt with many long responses widens every row of its forward, and the batch is cut
    where the next response would take it past the bound."""
    from streamrl.workers.reward_roles import teacher as module

    # A one-token response to another prompt, then 8 x 300 tokens to one prompt: counted
    # as left-padded rows, [that, 5 long] fits (6 x 301); shared, its two rows keep
    # 2 x 1503 columns.
    long_group = [([1, 2, 3], list(range(10, 310))) for _ in range(8)]
    short = [([4, 5], [6, 7]) for _ in range(40)]
    sequences = [([8], [9]), *long_group, *short]
    items = [_item(p, r) for p, r in sequences]
    order = list(range(len(sequences)))
    for shared in (True, False):
        teacher.share_prompts = shared
        try:
            start, forwards = 0, []
            while start < len(order):
                rows = teacher._batch(order, start, sequences, items)
                forwards.append(rows)
                start += len(rows)
        finally:
            teacher.share_prompts = True
        assert sorted(n for rows in forwards for n in rows) == order  # each response once
        for rows in forwards:
            taken = [sequences[n] for n in rows]
            assert len(rows) == 1 or module.kept_cells(taken, shared) <= module.TOKENS_PER_FORWARD
            if shared:
                assert module.shared_rows(taken, 0, torch.float32).keep * len(
                    {tuple(p) for p, _ in taken}
                ) == module.kept_cells(taken, True)


def test_kept_cells_a_row_at_a_time_match_the_layouts() -> None:
    """``KeptCells.after`` foretells what ``add`` then counts, and both agree with the rows
    the layouts build (the shared layout's kept columns per prompt row, the plain one's)."""
    import random

    from streamrl.workers.reward_roles.teacher import KeptCells, plain_rows, shared_rows

    rng = random.Random(0)
    prompts = [[rng.randrange(1, 50) for _ in range(rng.randrange(1, 6))] for _ in range(4)]
    sequences = [
        (rng.choice(prompts), [rng.randrange(1, 50) for _ in range(rng.randrange(1, 9))])
        for _ in range(30)
    ]
    for shared in (True, False):
        kept = KeptCells(shared)
        for n, (prompt, response) in enumerate(sequences):
            foretold = kept.after(prompt, response)
            kept.add(prompt, response)
            assert kept.cells == foretold
            taken = sequences[: n + 1]
            if shared:
                rows = shared_rows(taken, 0, torch.float32)
                assert kept.cells == rows.keep * len({tuple(p) for p, _ in taken})
            else:
                assert kept.cells == plain_rows(taken, 0).keep * len(taken)
