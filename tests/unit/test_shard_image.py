"""``take_image``: the image and its diff in one pass over the masters, against the two
steps it replaces (``local_bf16_shards``, then ``encode_shard``), byte for byte."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from streamrl.workers.learning.shard_image import encode_shard, local_bf16_shards, take_image

CHUNK, DENSE = 4096, 0.25


def model(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(96, 64), torch.nn.Linear(64, 33, bias=False))
    return net.to(dtype)


def nudge(net: torch.nn.Module, scale: float, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in net.parameters():
            noise = torch.randn(param.shape, generator=generator).to(param.dtype)
            param.add_(noise * param.abs() * scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threads", [0, 2])
def test_the_image_and_its_parts_are_the_cast_then_the_diff(dtype, threads) -> None:
    net = model(dtype)
    base = local_bf16_shards(net)
    pool = ThreadPoolExecutor(threads) if threads else None
    try:
        for version, scale in enumerate([0.0, 3e-3, 3e-2, 1.0]):  # nothing, sparse .. dense
            nudge(net, scale, seed=version)
            image, futures = take_image(
                net, base, chunk_bytes=CHUNK, dense_threshold=DENSE, pool=pool
            )
            parts = [p for f in futures if (p := f.result()) is not None]
            reference = local_bf16_shards(net)
            assert list(image) == list(reference)
            for name, shard in image.items():
                np.testing.assert_array_equal(shard.bits, reference[name].bits)
                assert (shard.full_shape, shard.row_offset) == (
                    reference[name].full_shape,
                    reference[name].row_offset,
                )
            expected = encode_shard(reference, base, chunk_bytes=CHUNK, dense_threshold=DENSE)
            assert [p.header for p in parts] == [p.header for p in expected]
            for got, want in zip(parts, expected, strict=True):
                assert bytes(got.values) == bytes(want.values)
                assert bytes(got.indices) == bytes(want.indices)
            assert (len(parts) == 0) == (scale == 0.0)
            base = image
    finally:
        if pool is not None:
            pool.shutdown()


def test_a_base_that_is_not_this_shards_image_is_refused() -> None:
    net = model(torch.float32)
    base = local_bf16_shards(net)
    first = next(iter(base))
    wrong = {**base, first: type(base[first])(base[first].bits[:-1], (1,), 0)}
    with pytest.raises(ValueError, match="no base image"):
        take_image(net, wrong, chunk_bytes=CHUNK, dense_threshold=DENSE)
    with pytest.raises(ValueError, match="no base image"):
        take_image(net, {}, chunk_bytes=CHUNK, dense_threshold=DENSE)
