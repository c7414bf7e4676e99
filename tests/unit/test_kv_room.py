"""RoomyLayer: the values of DynamicLayer's concatenation, appended in place."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from streamrl.workers.engines.kv_room import MIN_ROOM, RoomyLayer


def kv(rows: int, columns: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(rows, 3, columns, 8, generator=gen).bfloat16() for _ in range(2))


def test_appends_equal_concatenation_and_write_in_place_until_full():
    roomy, plain = RoomyLayer(), DynamicLayer()
    pointers = set()
    for step in range(2 * MIN_ROOM):
        new = kv(4, 5 if step == 0 else 1, step)  # a prefill, then decode steps
        keys, values = roomy.update(*new)
        expected = plain.update(*new)
        assert torch.equal(keys, expected[0]) and torch.equal(values, expected[1])
        pointers.add(keys.data_ptr())
    # 5 + 63 columns: the first buffer (5 + 32 room) filled once, then one reallocation.
    assert len(pointers) == 2


def test_tensors_the_engine_replaced_are_taken_over():
    """Rows leaving the batch: the engine sets keys/values to fresh tensors (an index)."""
    roomy = RoomyLayer()
    roomy.update(*kv(4, 6, 0))
    roomy.keys, roomy.values = roomy.keys[[0, 2]], roomy.values[[0, 2]]
    kept = (roomy.keys.clone(), roomy.values.clone())
    new = kv(2, 1, 1)
    keys, values = roomy.update(*new)
    assert torch.equal(keys, torch.cat([kept[0], new[0]], dim=-2))
    assert torch.equal(values, torch.cat([kept[1], new[1]], dim=-2))
    assert keys.shape == (2, 3, 7, 8)
