"""A KV-cache layer that appends a decode step in place instead of copying the whole cache.

transformers' ``DynamicLayer`` appends each step's keys and values with ``torch.cat``: every
decode step copies every layer's whole cache (SmolLM2 at batch 16: ~3 ms of a 41 ms step on a
CPU, growing with the length). ``RoomyLayer`` keeps its keys and values as views of buffers
with spare columns, so a step writes one column; a buffer is reallocated (with half its
length again as room) only when it is full, or when the engine replaced the tensors (rows
joining or leaving the batch: those copy anyway).

The views hold exactly the values ``DynamicLayer`` would: outputs are unchanged.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

MIN_ROOM = 32  # spare columns at least, per reallocation


class RoomyLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``keys``/``values`` are ``[:, :, :n]`` views of roomier
    buffers (``_key_room``/``_value_room``)."""

    _key_room: torch.Tensor | None = None
    _value_room: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self._key_room = _append(self.keys, self._key_room, key_states)
        self.values, self._value_room = _append(self.values, self._value_room, value_states)
        return self.keys, self.values


def _append(
    cached: torch.Tensor, room: torch.Tensor | None, new: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cat([cached, new], dim=-2)`` as a view of ``room`` (reallocated when needed); returns
    the view and the buffer."""
    length = cached.shape[-2] if cached.dim() == 4 else 0
    total = length + new.shape[-2]
    if room is None or not _is_prefix_view(cached, room, length) or total > room.shape[-2]:
        shape = (*new.shape[:2], total + max(MIN_ROOM, total // 2), new.shape[-1])
        room = new.new_empty(shape)
        if length:
            room[:, :, :length].copy_(cached)
    room[:, :, length:total].copy_(new)
    return room[:, :, :total], room


def _is_prefix_view(cached: torch.Tensor, room: torch.Tensor, length: int) -> bool:
    """Whether ``cached`` is ``room[:, :, :length]`` (the engine may have replaced it)."""
    if length == 0:
        return cached.numel() == 0
    return (
        cached.data_ptr() == room.data_ptr()
        and cached.shape[:2] == room.shape[:2]
        and cached.stride() == room.stride()
    )


def make_roomy(cache) -> None:
    """Turn the plain ``DynamicLayer``s of a fresh ``DynamicCache`` into ``RoomyLayer``s."""
    layers = cache.layers
    cache.layers = [RoomyLayer() if type(layer) is DynamicLayer else layer for layer in layers]
