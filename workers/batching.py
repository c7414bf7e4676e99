"""Turning trajectory groups into padded training tensors for the learner.

A micro-batch holds whole trajectories, right-padded. Right padding with causal attention
needs no attention mask: position j attends to positions <= j, all of them real tokens of its
own row, so the learner conditions on exactly the tokens the generator did, whatever the pad
id (SmolLM2's pad is its end-of-turn token, which a mask built from ids would hide).

Logits at position j predict token j+1. Only the *window* of target columns from the first
response token of the batch on is kept (``start`` = shortest prompt - 1): the learner asks the
model for those logits alone (``logits_to_keep``), never for the prompt's. ``targets``,
``mask``, ``behavior`` and ``versions`` cover that window.

Example: prompts of 5 and 7 tokens with 3-token responses -> width 10, ``start`` 4, window of
5 columns; row 0's response targets are window columns 0..2, row 1's are 2..4.

Which trajectories share a micro-batch is a *plan* (``micro_batch_rows``): runs of
``micro_batch_size`` in arrival order, or, with a token budget, trajectories sorted by length
and cut so that each micro-batch's padded tokens (rows x longest) stay within the budget. The
gradient does not depend on the plan (``train_step``'s reduction rule), only the padding does:
sorted, a micro-batch pads its rows to a length close to theirs, not to the batch's longest.
Each micro-batch keeps its rows' positions in the step (``rows``) to pair them with per-row
values (scores, advantages) computed in arrival order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from streamrl.protocol import TrajectoryGroup


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [B, W] right-padded
    start: int  # first logit position kept; window = positions start .. W-2
    targets: torch.Tensor  # [B, T] next tokens in the window (T = W - 1 - start)
    mask: torch.Tensor  # [B, T] 1.0 on response tokens
    behavior: torch.Tensor  # [B, T] behaviour logprobs at response tokens
    versions: torch.Tensor  # [B, T] int64 weight version that sampled each token (-1 elsewhere)
    temperatures: torch.Tensor  # [B] sampling temperature of each response
    response_lengths: torch.Tensor  # [B]
    rows: torch.Tensor  # [B] int64 position of each row among the step's trajectories
    # The one sampling temperature of every row; None when rows differ (scale row by row).
    temperature: float | None
    # Filled in by the training step:
    advantages: torch.Tensor | None = None  # [B] (group estimators) or [B, T] (GAE)
    returns: torch.Tensor | None = None  # [B, T] GAE returns (critic only)
    old_values: torch.Tensor | None = None  # [B, T] values before this step (critic only)
    proximal: torch.Tensor | None = None  # [B, T] logprobs at the step's starting weights
    ref_logprobs: torch.Tensor | None = None  # [B, T] reference-model logprobs

    def to(self, device: torch.device) -> MicroBatch:
        """The tensors on ``device``, copied once per step before any forward (from pinned
        memory, without blocking): a pageable copy in the loop would stall the GPU queue."""
        if device.type == "cpu":
            return self
        for name in _ON_DEVICE:
            tensor = getattr(self, name)
            if tensor is not None and tensor.device != device:
                setattr(self, name, tensor.pin_memory().to(device, non_blocking=True))
        return self

    @property
    def keep(self) -> int:
        """``logits_to_keep`` for the forward: the last ``W - start`` positions."""
        return self.input_ids.shape[1] - self.start

    def __len__(self) -> int:
        return self.input_ids.shape[0]


# What the forward and the losses read; temperatures and lengths stay on the host (read there).
_ON_DEVICE = (
    "input_ids",
    "targets",
    "mask",
    "behavior",
    "versions",
    "advantages",
    "returns",
    "old_values",
    "proximal",
    "ref_logprobs",
)


def build_micro_batches(
    groups: list[TrajectoryGroup],
    size: int,
    pad_id: int,
    *,
    plan: list[list[int]] | None = None,
    first_row: int = 0,
) -> list[MicroBatch]:
    """Right-padded micro-batches of ``groups``' trajectories, built from the wire's raw arrays
    (``torch.frombuffer`` on each chunk's bytes, joined once; no per-token Python work).

    ``plan`` lists each micro-batch's trajectories by index (default: runs of ``size`` in
    order); ``first_row`` is the step position of ``groups``' first trajectory."""
    trajectories = [t for g in groups for t in g.trajectories]
    if plan is None:
        plan = micro_batch_rows([0] * len(trajectories), size)
    return [
        _micro_batch([trajectories[i] for i in rows], pad_id, torch.tensor(rows) + first_row)
        for rows in plan
    ]


def micro_batch_rows(lengths: Sequence[int], size: int, token_budget: int = 0) -> list[list[int]]:
    """Each micro-batch's trajectories, by index into ``lengths`` (tokens per trajectory).

    Without a budget: runs of ``size`` in order. With one: longest first (the largest
    activations come first, so a budget too big for memory fails on the first micro-batch),
    filled greedily while rows x longest <= ``token_budget``; a trajectory longer than the
    budget goes alone. Example: lengths [3, 9, 4, 8], budget 16 -> [[1], [3, 2], [0]]."""
    if token_budget <= 0:
        return [list(range(i, min(i + size, len(lengths)))) for i in range(0, len(lengths), size)]
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    plan: list[list[int]] = []
    for i in order:
        # Sorted longest first: the chunk's width is that of its first row.
        if plan and (len(plan[-1]) + 1) * lengths[plan[-1][0]] <= token_budget:
            plan[-1].append(i)
        else:
            plan.append([i])
    return plan


def resize_plan(plan: list[list[int]], lengths: Sequence[int], count: int) -> list[list[int]]:
    """``plan`` with exactly ``count`` micro-batches (under FSDP every rank must run as many
    forward and backward passes): while too few, the costliest one with two or more rows is
    halved; while too many, the two neighbours whose union pads the fewest tokens merge.
    ``1 <= count <= len(lengths)``."""
    if not 1 <= count <= len(lengths):
        raise ValueError(f"cannot plan {count} micro-batches for {len(lengths)} trajectories")

    def padded(rows: list[int]) -> int:
        return len(rows) * max(lengths[i] for i in rows)

    plan = [list(rows) for rows in plan]
    while len(plan) < count:
        k = max((k for k in range(len(plan)) if len(plan[k]) > 1), key=lambda k: padded(plan[k]))
        half = len(plan[k]) // 2
        plan[k : k + 1] = [plan[k][:half], plan[k][half:]]
    while len(plan) > count:
        k = min(range(len(plan) - 1), key=lambda k: padded(plan[k] + plan[k + 1]))
        plan[k : k + 2] = [plan[k] + plan[k + 1]]
    return plan


def _micro_batch(chunk: list, pad_id: int, rows: torch.Tensor) -> MicroBatch:
    prompt = torch.tensor([t.num_prompt_tokens for t in chunk])
    response = torch.tensor([t.num_response_tokens for t in chunk])
    width = int((prompt + response).max())
    columns = torch.arange(width)
    ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
    # Boolean-mask assignment fills row by row, left to right: the order of the bytes.
    tokens = _joined((p for t in chunk for p in (t.prompt_ids, t.response_ids)), torch.int32)
    ids[columns < (prompt + response)[:, None]] = tokens.long()
    # Response token k of a row sits at target column p-1+k; keep columns from the first one.
    start = max(int(prompt.min()) - 1, 0)
    targets = columns[start:-1]
    first = (prompt - 1)[:, None]
    is_response = (targets >= first) & (targets < first + response[:, None])
    behavior = torch.zeros(is_response.shape)
    behavior[is_response] = _joined((t.behavior_logprobs for t in chunk), torch.float32)
    versions = torch.full(is_response.shape, -1, dtype=torch.long)
    versions[is_response] = _joined((t.token_versions for t in chunk), torch.int32).long()
    temperatures = torch.tensor([t.temperature for t in chunk])
    uniform = bool((temperatures == temperatures[0]).all())
    return MicroBatch(
        input_ids=ids,
        start=start,
        targets=ids[:, start + 1 :],
        mask=is_response.float(),
        behavior=behavior,
        versions=versions,
        temperatures=temperatures,
        response_lengths=response,
        rows=rows,
        temperature=float(temperatures[0]) if uniform else None,
    )


def in_step_order(batches: list[MicroBatch], values: list[torch.Tensor]) -> torch.Tensor:
    """Per-row ``values`` of each micro-batch ([B] each), as one tensor in step order."""
    rows = torch.cat([b.rows for b in batches])
    out = torch.empty(len(rows), dtype=values[0].dtype)
    out[rows] = torch.cat(values)
    return out


def split_groups(groups: list[TrajectoryGroup], parts: int) -> list[list[TrajectoryGroup]]:
    """``parts`` equal runs of whole groups (PPO mini-batches); ``len(groups) % parts == 0``."""
    if parts < 1 or len(groups) % parts:
        raise ValueError(f"cannot split {len(groups)} groups into {parts} equal mini-batches")
    size = len(groups) // parts
    return [groups[i : i + size] for i in range(0, len(groups), size)]


def _joined(parts: Iterable[bytes], dtype: torch.dtype) -> torch.Tensor:
    """The raw arrays ``parts`` (little-endian, as the wire carries them), concatenated: one
    copy, into a writable buffer that the tensor then shares."""
    data = bytearray().join(parts)
    return torch.frombuffer(data, dtype=dtype) if data else torch.zeros(0, dtype=dtype)
