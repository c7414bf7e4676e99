"""PackedWeight: a version written into the spare packed copy is byte for byte what oneDNN's
reorder makes, stacked members included; the copy a forward reads is never written; layouts
that are not a plain row blocking keep the reorder."""

from __future__ import annotations

import pytest
import torch

from streamrl.hardware import cpu_bf16_is_fast
from streamrl.workers.engines.packed_linear import PackedWeight, _blocks, _layout_block

pytestmark = pytest.mark.skipif(not cpu_bf16_is_fast(), reason="no oneDNN bf16 matmul here")


def packed_bytes(packed: torch.Tensor) -> torch.Tensor:
    return _blocks(packed, 1, 2).reshape(-1).clone()


def reorder(members: list[torch.Tensor]) -> torch.Tensor:
    return packed_bytes(torch.ops.mkldnn._reorder_linear_weight(torch.cat(members), 16))


def random_members(sizes: list[int], cols: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, cols, generator=gen).bfloat16() for n in sizes]


@pytest.mark.parametrize(
    ("sizes", "cols"),
    [([576, 192, 192], 576), ([1536, 1536], 576), ([576], 1536), ([128], 64), ([100], 64)],
)
def test_each_version_packs_to_the_reorders_bytes(sizes, cols) -> None:
    weights = PackedWeight(random_members(sizes, cols, seed=0), rows=16)
    for version in range(1, 4):
        members = random_members(sizes, cols, seed=version)
        reading = weights.current
        before = packed_bytes(reading)
        packed = weights.pack(members)
        assert torch.equal(packed_bytes(reading), before)  # the forward's copy is untouched
        weights.adopt(packed)
        assert weights.current is packed
        assert torch.equal(packed_bytes(packed), reorder(members))
    if _layout_block(sum(sizes), cols, 16) is not None:
        assert weights.spare is not None  # from the second version on: no new copies
        assert weights.pack(members) is weights.spare


def test_a_padded_layout_is_not_taken_for_a_blocking() -> None:
    assert _layout_block(100, 64, 16) is None  # 100 rows: padded to a block of rows
    assert _layout_block(128, 63, 16) is None  # an odd row: padded pairs
    assert _layout_block(128, 64, 16) in (16, 32, 64)
