"""The generator's side of on-policy distillation (docs/design.md §7d): a group's teacher
answers become each trajectory's ``teacher_logprobs`` and ``teacher_coef``.

Each teacher (``rewards: - teacher``) that scored a group gives every response one
log-probability per response token. With teachers k of weights w_k, a response carries

    teacher_coef     = sum_k w_k
    teacher_logprobs = sum_k w_k t_k / sum_k w_k         (per token)

so that the learner's per-token term ``teacher_coef * (teacher_logprobs - behaviour)`` is
exactly ``sum_k w_k (t_k - behaviour)``: one array on the wire whatever the number of
teachers. Each teacher's figure in ``reward_parts`` is the response's sampled reverse KL to
it, the mean over the policy's tokens of ``behaviour - t_k`` (0 when the student samples as
the teacher would; it adds nothing to the reward: a teacher's weight in the reward mix is 0).

Example: one teacher of weight 1, behaviour [-0.1, -2.0], teacher [-0.2, -0.5] ->
teacher_coef 1, teacher_logprobs [-0.2, -0.5], reward part ((-0.1 + 0.2) + (-2.0 + 0.5)) / 2
= -0.7.

No torch: the generator imports it.
"""

from __future__ import annotations

from streamrl.protocol import Trajectory, pack_float32, unpack_float32


def check_answer(
    trajectories: list[Trajectory],
    arrays: list[bytes],
    top_ids: list[bytes] | None = None,
    top_logprobs: list[bytes] | None = None,
    top_k: int = 0,
) -> str:
    """Why a teacher's answer does not fit the group ("" when it does): ``arrays`` must
    hold one log-probability per response token of each trajectory, and with ``top_k``,
    ``top_ids`` and ``top_logprobs`` k per token. The group is refused with the reason."""
    if len(arrays) != len(trajectories):
        return f"{len(arrays)} teacher arrays for {len(trajectories)} responses"
    for j, (t, data) in enumerate(zip(trajectories, arrays, strict=True)):
        if len(data) != len(t.response_ids):
            have, need = len(data) // 4, t.num_response_tokens
            return f"response {j}: {have} teacher logprobs for {need} tokens"
    if not top_k:
        return ""
    ids, lps = top_ids or [], top_logprobs or []
    if not len(ids) == len(lps) == len(trajectories):
        return f"{len(ids)}/{len(lps)} top-k arrays for {len(trajectories)} responses"
    for j, (t, a, b) in enumerate(zip(trajectories, ids, lps, strict=True)):
        if not len(a) == len(b) == top_k * len(t.response_ids):
            return f"response {j}: top-k arrays of {len(a)}/{len(b)} bytes, not k={top_k} per token"
    return ""


def reverse_kl(behaviour: list[float], teacher: list[float], mask: bytes) -> float | None:
    """Mean over the policy's tokens (``mask``) of ``behaviour - teacher`` (None: none)."""
    terms = [b - s for b, s, m in zip(behaviour, teacher, mask, strict=True) if m]
    return sum(terms) / len(terms) if terms else None


def attach_teachers(
    trajectories: list[Trajectory], answers: dict[int, tuple[float, list[bytes]]]
) -> dict[int, list[float | None]]:
    """Give each trajectory its teachers' combined logprobs and coefficient (module doc).
    ``answers``: per teacher (reward index), its weight and one array per trajectory (checked
    by ``check_answer``). Returns per teacher each response's reverse-KL figure."""
    figures: dict[int, list[float | None]] = {k: [] for k in answers}
    for j, t in enumerate(trajectories):
        behaviour, mask = t.logprob_list(), t.policy_mask()
        total = 0.0
        combined = [0.0] * len(behaviour)
        for k, (weight, arrays) in answers.items():
            teacher = unpack_float32(arrays[j])
            figures[k].append(reverse_kl(behaviour, teacher, mask))
            if weight > 0:
                total += weight
                combined = [c + weight * v for c, v in zip(combined, teacher, strict=True)]
        if total > 0:
            t.teacher_logprobs = pack_float32(c / total for c in combined)
            t.teacher_coef = total
    return figures


def attach_top_k(
    trajectories: list[Trajectory], weight: float, ids: list[bytes], logprobs: list[bytes]
) -> None:
    """A top-k teacher's arrays onto each trajectory (``teacher_top_*``), as they came: one
    such teacher scores a response (the config holds it)."""
    if weight <= 0:
        return
    for t, a, b in zip(trajectories, ids, logprobs, strict=True):
        if t.response_ids:
            t.teacher_top_ids, t.teacher_top_logprobs, t.teacher_top_coef = a, b, weight
