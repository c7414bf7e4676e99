"""``SpareCopies`` and ``copy_at``: an engine's copy taking versions by changed elements.

Reference: the image itself (after every swap the live tensor is exactly the image's values
in the engine's dtype), whatever happened between: an update prepared and dropped, a tensor
replaced whole, positions named twice.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamrl.workers.diff_kernels import copy_at
from streamrl.workers.engines.spare_copies import SpareCopies


def moved(image: torch.Tensor, share: float, seed: int) -> np.ndarray:
    """Change ``share`` of the image's elements in place; their flat positions."""
    rng = np.random.default_rng(seed)
    where = np.flatnonzero(rng.random(image.numel()) < share)
    flat = image.view(-1)
    flat[torch.from_numpy(where)] = torch.randn(
        where.size, generator=torch.Generator().manual_seed(seed)
    ).to(image.dtype)
    return where


@pytest.mark.parametrize("share", [0.01, 0.05], ids=["scattered", "copied-whole"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_swap_leaves_the_live_tensor_at_the_image(dtype: torch.dtype, share: float) -> None:
    image = torch.randn(64, 96).to(torch.bfloat16)
    param = torch.nn.Parameter(image.to(dtype, copy=True), requires_grad=False)
    spares = SpareCopies()
    for version in range(1, 8):
        where = moved(image, share, version)
        positions = {"w": where}
        assert spares.positions_for("w", image, param, positions) is where
        swap = spares.write("w", param, image, where)
        if version == 3:  # prepared, never adopted: the image goes back, v3 again later
            image.view(-1)[torch.from_numpy(where)] = param.data.view(-1)[
                torch.from_numpy(where)
            ].to(torch.bfloat16)
            where = moved(image, share, 100 + version)
            swap = spares.write("w", param, image, where)
        before = param.data.clone()
        swap()
        assert torch.equal(param.data, image.to(dtype)), version
        assert not torch.equal(param.data, before)


def test_a_tensor_replaced_whole_drops_its_spare() -> None:
    image = torch.randn(10, 10).to(torch.bfloat16)
    param = torch.nn.Parameter(image.float(), requires_grad=False)
    spares = SpareCopies()
    spares.write("w", param, image, moved(image, 0.1, 1))()
    image.add_(1)
    param.data = image.float()  # replaced another way (whole)
    spares.drop("w")
    where = moved(image, 0.1, 2)
    spares.write("w", param, image, where)()
    assert torch.equal(param.data, image.float())


def test_positions_are_refused_where_a_whole_tensor_is_right() -> None:
    image = torch.zeros(100, dtype=torch.bfloat16)
    param = torch.nn.Parameter(torch.zeros(100), requires_grad=False)
    spares = SpareCopies()
    few = np.arange(10)
    assert spares.positions_for("w", image, param, {"w": few}) is few
    assert spares.positions_for("w", image, param, None) is None
    assert spares.positions_for("w", image.float(), param, {"w": few}) is None  # not bf16
    assert spares.positions_for("w", image[:50], param, {"w": few}) is None  # another shape


def test_copy_at_widens_exactly_and_refuses_a_position_outside() -> None:
    source = torch.tensor([1.5, -0.0, float("inf"), float("nan"), 3e-39], dtype=torch.bfloat16)
    bits = source.view(torch.int16).numpy()
    target = torch.zeros(5)
    where = np.array([4, 0, 2, 3, 1, 0], np.int64)  # any order, a repeat
    copy_at(where, bits, target.view(torch.int32).numpy().view(np.uint32))
    assert torch.equal(target.view(torch.int32), source.float().view(torch.int32))
    half = torch.zeros(5, dtype=torch.bfloat16)
    copy_at(where, bits, half.view(torch.int16).numpy().view(np.uint16))
    assert torch.equal(half.view(torch.int16), source.view(torch.int16))
    with pytest.raises(ValueError, match="outside"):
        copy_at(np.array([5]), bits, target.view(torch.int32).numpy().view(np.uint32))
    with pytest.raises(ValueError, match="outside"):
        copy_at(np.array([-1]), bits, target.view(torch.int32).numpy().view(np.uint32))
