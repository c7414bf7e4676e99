"""Turning trajectory groups into padded training tensors for the learner.

A micro-batch holds whole trajectories, right-padded; its mask marks the response tokens at
their *target* positions (logits at position j predict token j+1), which is where behaviour
logprobs, advantages and losses live.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from streamrl.protocol import TrajectoryGroup


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [B, T] (right-padded)
    targets: torch.Tensor  # [B, T-1] next tokens
    mask: torch.Tensor  # [B, T-1] 1 on response tokens
    behavior: torch.Tensor  # [B, T-1] behaviour logprobs at response tokens
    advantages: torch.Tensor  # [B]
    temperatures: torch.Tensor  # [B] sampling temperature of each response
    returns: torch.Tensor | None = None  # [B, T-1] GAE returns (critic only)
    old_values: torch.Tensor | None = None  # [B, T-1] values before this step (critic only)


def build_micro_batches(
    groups: list[TrajectoryGroup], advantages: torch.Tensor, size: int, pad_id: int
) -> list[MicroBatch]:
    """Right-padded micro-batches of ``size`` trajectories, built from the wire's raw arrays
    (``torch.frombuffer`` on each chunk's bytes, joined once; no per-token Python work)."""
    trajectories = [t for g in groups for t in g.trajectories]
    batches = []
    for start in range(0, len(trajectories), size):
        chunk = trajectories[start : start + size]
        prompt = torch.tensor([t.num_prompt_tokens for t in chunk])
        response = torch.tensor([t.num_response_tokens for t in chunk])
        width = int((prompt + response).max())
        columns = torch.arange(width)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        # Boolean-mask assignment fills row by row, left to right: the order of the bytes.
        tokens = _joined((p for t in chunk for p in (t.prompt_ids, t.response_ids)), torch.int32)
        ids[columns < (prompt + response)[:, None]] = tokens.long()
        # Logits at position j predict token j+1: response token k sits at target p-1+k.
        targets = columns[:-1]
        first = (prompt - 1)[:, None]
        is_response = (targets >= first) & (targets < first + response[:, None])
        behavior = torch.zeros((len(chunk), width - 1))
        behavior[is_response] = _joined((t.behavior_logprobs for t in chunk), torch.float32)
        batches.append(
            MicroBatch(
                ids,
                ids[:, 1:],
                is_response.float(),
                behavior,
                advantages[start : start + len(chunk)],
                torch.tensor([t.temperature for t in chunk]),
            )
        )
    return batches


def _joined(parts: Iterable[bytes], dtype: torch.dtype) -> torch.Tensor:
    """The raw arrays ``parts`` (little-endian, as the wire carries them), concatenated: one
    copy, into a writable buffer that the tensor then shares."""
    data = bytearray().join(parts)
    return torch.frombuffer(data, dtype=dtype) if data else torch.zeros(0, dtype=dtype)
