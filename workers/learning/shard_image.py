"""A learner rank's bf16 image of its shard, and its diff from the last one (docs/design.md §4).

The weight publisher (``publisher.py``) sends what this module builds: each trained
parameter's rows on this rank (``LocalShard``: flat bf16 bits), taken after an optimizer step,
and the blocks of it that changed since the image before (``weight_codec.encode_part``).

Taking an image and diffing it are one pass where the masters are float32 on the host
(``take_image``): each block's masters are read once, rounded to bf16 into the new image and
compared with the old image in the same vector step (``diff_kernels.sparse_diff``'s
``source``), so the new image is never read back from memory. For SmolLM2-135M that was
0.08 s on two threads of an Intel Xeon with AMX against 0.14 s for the cast then the diff
(docs/experiments.md, 2026-12-06 session 23). Elsewhere (a GPU's masters, bf16 masters) the
image is copied to the host first and then diffed, as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass

import numpy as np
import torch

from streamrl.models.lora import wire_name
from streamrl.protocol import ImageChecksum
from streamrl.workers.weight_codec import (
    EncodedPart,
    as_i16,
    encode_part,
    image_checksum,
    image_digests,
    row_blocks,
    shard_rows,
)


@dataclass(frozen=True)
class LocalShard:
    """This rank's rows ``[row_offset, row_offset + rows)`` of a parameter, as flat bf16 bits."""

    bits: np.ndarray  # int16, flat, owned (a copy, never a view of the live parameter)
    full_shape: tuple[int, ...]
    row_offset: int

    @property
    def rows(self) -> int:
        return self.bits.size // _row_elems(self)


@dataclass(frozen=True)
class _Rows:
    """One trained parameter's rows on this rank, live (the masters themselves)."""

    name: str
    data: torch.Tensor
    full_shape: tuple[int, ...]
    row_offset: int

    def snapshot(self) -> LocalShard:
        # One copy: fp32 master -> bf16 on the host (or a plain copy when already bf16).
        bits = as_i16(self.data.to("cpu", torch.bfloat16, copy=True))
        return LocalShard(bits, self.full_shape, self.row_offset)


def _local_rows(model: torch.nn.Module, shard_rank: int | None) -> list[_Rows]:
    """Every trained parameter's rows on this rank (tied weights once; a LoRA model's adapters
    only, by the adapter file's names: ``streamrl.models.lora``). FSDP2 parameters are
    DTensors sharded ``Shard(0)`` with ``torch.chunk`` row ranges; plain parameters are the
    whole tensor at offset 0."""
    rows: list[_Rows] = []
    adapters = hasattr(model, "peft_config")
    for name, param in model.named_parameters():
        if adapters:
            if not param.requires_grad:
                continue  # the frozen base: every generator loaded it, it never changes
            name = wire_name(name)
        data = param.detach()
        offset = 0
        if hasattr(data, "to_local"):
            placements = tuple(type(p).__name__ for p in data.placements)
            if placements != ("Shard",) or data.placements[0].dim != 0:
                raise ValueError(f"{name}: expected FSDP2 Shard(0), got {data.placements}")
            mesh = data.device_mesh
            index = mesh.get_local_rank() if shard_rank is None else shard_rank
            offset, stop = shard_rows(data.shape[0], index, mesh.size())
            local = data.to_local()
            if local.shape[0] != stop - offset:
                raise ValueError(f"{name}: local rows {local.shape[0]} != {stop - offset}")
            data = local
        rows.append(_Rows(name, data, tuple(param.shape), offset))
    return rows


def local_bf16_shards(
    model: torch.nn.Module, shard_rank: int | None = None, pool: Executor | None = None
) -> dict[str, LocalShard]:
    """name -> bf16 snapshot of this rank's rows, for every trained parameter
    (``_local_rows``). ``shard_rank``: this rank's index on the (1-D) FSDP mesh; by default
    the mesh is asked, which needs its process group. ``pool``: threads the host parameters
    are cast on (a GPU's are copied on the calling thread, in its stream's order)."""
    rows = _local_rows(model, shard_rank)
    on_host = all(row.data.device.type == "cpu" for row in rows)
    if pool is not None and on_host:
        shards = list(pool.map(_Rows.snapshot, rows))
    else:
        shards = [row.snapshot() for row in rows]
    return {row.name: shard for row, shard in zip(rows, shards, strict=True)}


def _host_masters(data: torch.Tensor) -> np.ndarray | None:
    """The masters as a flat float32 numpy view where they live so on the host, else None."""
    if data.device.type != "cpu" or data.dtype != torch.float32 or not data.is_contiguous():
        return None
    return data.reshape(-1).numpy()


# A block: rows [start, stop) of one tensor's shard, cut by ``row_blocks`` to fit a chunk.
_Block = tuple[str, int, int]


def _blocks(image: dict[str, LocalShard], chunk_bytes: int) -> list[_Block]:
    """Every block of ``image``, in its order (the order parts are sent in)."""
    return [
        (name, start, stop)
        for name, shard in image.items()
        for start, stop in row_blocks(shard.rows, _row_elems(shard), chunk_bytes)
    ]


def _row_elems(shard: LocalShard) -> int:
    return max(math.prod(shard.full_shape[1:]), 1)


def _encode_block(
    block: _Block,
    image: dict[str, LocalShard],
    base: dict[str, LocalShard] | None,
    dense_threshold: float,
    masters: np.ndarray | None = None,
) -> EncodedPart | None:
    """One block of ``image`` against ``base`` (``weight_codec.encode_part``); ``masters``:
    the tensor's flat float32 masters, from which the block's image is written first."""
    name, start, stop = block
    shard = image[name]
    lo, hi = start * _row_elems(shard), stop * _row_elems(shard)
    return encode_part(
        name,
        shard.bits[lo:hi],
        None if base is None else base[name].bits[lo:hi],
        full_shape=shard.full_shape,
        row_offset=shard.row_offset + start,
        rows=stop - start,
        dense_threshold=dense_threshold,
        source=None if masters is None else masters[lo:hi],
    )


def take_image(
    model: torch.nn.Module,
    base: dict[str, LocalShard],
    *,
    chunk_bytes: int,
    dense_threshold: float,
    shard_rank: int | None = None,
    pool: Executor | None = None,
) -> tuple[dict[str, LocalShard], list[Future[EncodedPart | None]]]:
    """This rank's bf16 image now and its diff against ``base`` (the image taken before),
    block by block on ``pool``'s threads (module doc): returns the image, complete once every
    future is done, and each block's part (``None``: unchanged) in ``encode_shard``'s
    order. The masters must not change until then."""
    image: dict[str, LocalShard] = {}
    masters: dict[str, np.ndarray | None] = {}
    for row in _local_rows(model, shard_rank):
        if row.name not in base or base[row.name].bits.size != row.data.numel():
            raise ValueError(f"{row.name}: no base image of its {row.data.numel()} elements")
        masters[row.name] = host = _host_masters(row.data)
        if host is None:  # a GPU's or a bf16 master: copied here, in its stream's order
            image[row.name] = row.snapshot()
        else:
            bits = np.empty(host.size, np.int16)  # written by the blocks' passes
            image[row.name] = LocalShard(bits, row.full_shape, row.row_offset)

    def encode(block: _Block) -> EncodedPart | None:
        return _encode_block(block, image, base, dense_threshold, masters[block[0]])

    blocks = _blocks(image, chunk_bytes)
    if pool is not None:
        return image, [pool.submit(encode, block) for block in blocks]
    futures: list[Future[EncodedPart | None]] = []
    for block in blocks:
        future: Future[EncodedPart | None] = Future()
        future.set_result(encode(block))
        futures.append(future)
    return image, futures


def encode_shard(
    image: dict[str, LocalShard],
    base: dict[str, LocalShard] | None,
    *,
    chunk_bytes: int,
    dense_threshold: float,
    pool: Executor | None = None,
) -> list[EncodedPart]:
    """Every changed block of ``image`` against ``base`` (``None``: every block, dense), in
    ``image``'s order; the blocks are encoded on ``pool``'s threads where given."""
    return list(
        encoded_blocks(
            image, base, chunk_bytes=chunk_bytes, dense_threshold=dense_threshold, pool=pool
        )
    )


def encoded_blocks(
    image: dict[str, LocalShard],
    base: dict[str, LocalShard] | None,
    *,
    chunk_bytes: int,
    dense_threshold: float,
    pool: Executor | None = None,
) -> Iterator[EncodedPart]:
    """``encode_shard``'s parts as they are encoded, in order (the pool works ahead), so
    that the first can be sent while the rest are still being encoded."""

    def encode(block: _Block) -> EncodedPart | None:
        return _encode_block(block, image, base, dense_threshold)

    blocks = _blocks(image, chunk_bytes)
    encoded = pool.map(encode, blocks) if pool is not None else map(encode, blocks)
    return (part for part in encoded if part is not None)


def whole_tensors(image: dict[str, LocalShard]) -> dict[str, torch.Tensor]:
    """The shards that hold their whole tensor (a single rank's), as bf16 tensors of its shape
    sharing the snapshot's memory: what a one-rank learner's compute image would cast anew
    (``fsdp.offer_compute_image``)."""
    return {
        name: torch.from_numpy(shard.bits).view(torch.bfloat16).view(shard.full_shape)
        for name, shard in image.items()
        if shard.row_offset == 0 and shard.rows == shard.full_shape[0]
    }


def shard_image_checksum(image: dict[str, LocalShard]) -> ImageChecksum:
    """The whole-image checksum of this rank's shard (every tensor's rows, in ``image`` order)."""
    digests = image_digests([shard.bits for shard in image.values()])
    return ImageChecksum(
        names=list(image),
        row_offsets=[shard.row_offset for shard in image.values()],
        rows=[shard.rows for shard in image.values()],
        digests=digests.tobytes(),
        checksum=image_checksum(digests),
    )
