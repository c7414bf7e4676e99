"""The bf16 diff codec: round trips of every encoding, checksums, and FSDP2's row split.

References: the new image itself (a decoded diff must reproduce it bit for bit), ``torch.chunk``
(what FSDP2 documents for dim-0 sharding) and FSDP2's own local shards under a fake process
group (one process plays each rank in turn; nothing is communicated).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

from streamrl.workers.learning.fsdp import shard_for_training
from streamrl.workers.learning.publisher import chunk_parts, stream_chunks
from streamrl.workers.learning.shard_image import encode_shard, local_bf16_shards
from streamrl.workers.sparse_index import decode_positions, encode_positions
from streamrl.workers.weight_codec import (
    EncodedPart,
    apply_in_place,
    apply_part,
    changed_elements,
    changed_positions,
    encode_part,
    row_blocks,
    shard_rows,
)


def bits(n: int, seed: int = 0) -> np.ndarray:
    t = torch.randn(n, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    return t.view(torch.int16).numpy().copy()


def changed(old: np.ndarray, fraction: float, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    new = old.copy()
    where = rng.random(old.size) < fraction
    new[where] ^= 1  # flip the lowest mantissa bit: the smallest change bf16 can make
    return new


def encode(new, old, dense_threshold=0.25) -> EncodedPart | None:
    return encode_part(
        "w",
        new,
        old,
        full_shape=(new.size,),
        row_offset=0,
        rows=new.size,
        dense_threshold=dense_threshold,
    )


@pytest.mark.parametrize("n", [1, 7, 255, 256, 1000, 100_000])
def test_positions_round_trip(n: int) -> None:
    rng = np.random.default_rng(n)
    for k in {0, 1, n // 3, n}:
        positions = np.sort(rng.choice(n, size=k, replace=False))
        data = encode_positions(positions, n)
        assert len(data) == -(-n // 255) + k  # a byte per window, a byte per position
        np.testing.assert_array_equal(decode_positions(data, n), positions)


def test_a_sparse_index_that_does_not_fit_its_block_is_refused() -> None:
    data = encode_positions(np.array([3, 300, 599]), 600)
    assert list(data[:3]) == [1, 1, 1] and list(data[3:]) == [3, 45, 89]
    with pytest.raises(ValueError, match="offsets"):
        decode_positions(data[:-1], 600)  # a count names an offset that is missing
    with pytest.raises(ValueError, match="windows"):
        decode_positions(data[:2], 600)
    with pytest.raises(ValueError, match="beyond"):
        decode_positions(data, 591)  # 599 lies past a block of 591
    with pytest.raises(ValueError, match="window of 255"):
        decode_positions(bytes([1, 0, 0, 255]), 600)  # an offset that names the next window


@pytest.mark.parametrize(
    ("fraction", "encoding"),
    [(0.001, "sparse"), (0.02, "sparse"), (0.2, "bitmap"), (0.6, "dense"), (1.0, "dense")],
)
def test_each_encoding_reproduces_the_new_image(fraction: float, encoding: str) -> None:
    old = bits(50_000)
    new = changed(old, fraction)
    part = encode(new, old, dense_threshold=0.5)
    assert part is not None and part.header.encoding == encoding
    assert part.header.num_changed == int((new != old).sum())
    out = apply_part(part, old)
    np.testing.assert_array_equal(out, new)
    assert part.nbytes <= new.nbytes
    np.testing.assert_array_equal(old, bits(50_000))  # the base is never modified


def test_unchanged_block_is_left_out_and_snapshot_is_dense() -> None:
    old = bits(100)
    assert encode(old.copy(), old) is None
    snapshot = encode(old, None)
    assert snapshot.header.encoding == "dense"
    np.testing.assert_array_equal(apply_part(snapshot, np.zeros_like(old)), old)


def test_sparse_positions_beyond_uint16_gaps() -> None:
    old = bits(200_000)
    new = old.copy()
    new[[0, 3, 70_000, 199_999]] ^= 1
    part = encode(new, old)
    assert part.header.encoding == "sparse"
    np.testing.assert_array_equal(apply_part(part, old), new)


@pytest.mark.parametrize("fraction", [0.01, 0.2, 1.0])
def test_corrupted_values_fail_the_checksum(fraction: float) -> None:
    old = bits(10_000)
    new = changed(old, fraction)
    part = encode(new, old, dense_threshold=0.5)
    values = bytearray(memoryview(part.values).cast("B"))
    values[len(values) // 2] ^= 0x10
    with pytest.raises(ValueError, match="checksum"):
        apply_part(EncodedPart(part.header, bytes(values), part.indices), old)
    # Applied to the wrong base (a missed version), a sparse diff fails the same way.
    if part.header.encoding != "dense":
        with pytest.raises(ValueError, match="checksum"):
            apply_part(part, changed(old, 0.01, seed=9))


def test_malformed_parts_are_rejected() -> None:
    old = bits(1000)
    part = encode(changed(old, 0.01), old)
    with pytest.raises(ValueError):
        apply_part(EncodedPart(part.header, part.values[:-1], part.indices), old)
    with pytest.raises(ValueError):
        apply_part(part, old[:10])  # positions beyond the block
    dense = encode(old, None)
    with pytest.raises(ValueError, match="dense size"):
        apply_part(dense, old[:-1])


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 7, 8, 16])
def test_shard_rows_matches_torch_chunk(world: int) -> None:
    for n in range(0, 40):
        chunks = torch.arange(n).chunk(world) if n else []
        for rank in range(world):
            start, stop = shard_rows(n, rank, world)
            expected = chunks[rank].tolist() if rank < len(chunks) else []
            assert list(range(start, stop)) == expected, (n, world, rank)


def test_row_blocks_cover_rows_within_the_size_bound() -> None:
    for rows, row_elems, max_bytes in [(10, 3, 12), (10, 3, 1000), (7, 100, 50), (0, 4, 64)]:
        blocks = row_blocks(rows, row_elems, max_bytes)
        assert [r for a, b in blocks for r in range(a, b)] == list(range(rows))
        for a, b in blocks:
            assert (b - a) * row_elems * 2 <= max_bytes or b - a == 1


def test_chunks_hold_whole_parts_within_the_bound() -> None:
    parts = [encode(bits(n, seed=n), None) for n in (10, 500, 20, 300, 300, 1000)]
    chunks = chunk_parts(parts, chunk_bytes=1200)
    assert [p for c in chunks for p in c] == parts
    for chunk in chunks:
        assert sum(p.nbytes for p in chunk) <= 1200 or len(chunk) == 1
    assert chunk_parts([], 100) == [[]]  # a version with no change still sends one message


def test_a_sparse_diff_streams_in_chunks_of_the_rows_it_covers() -> None:
    """Chunks are cut by the image bytes their parts cover, not by their payload: a sparse
    diff of many blocks leaves in several chunks (each sent as soon as the next part shows
    it full), and only the last is marked last."""
    rng = np.random.default_rng(0)
    olds = [bits(500, seed=n) for n in range(8)]
    parts = []
    for old in olds:
        new = old.copy()
        new[rng.choice(500, 5, replace=False)] ^= 1  # 1% changed: a few bytes of payload
        parts.append(encode(new, old))
    assert sum(p.nbytes for p in parts) < 1200 < sum(p.image_bytes for p in parts)
    streamed = list(stream_chunks(iter(parts), chunk_bytes=2000))
    assert [last for _, last in streamed] == [False] * (len(streamed) - 1) + [True]
    assert [p for c, _ in streamed for p in c] == parts
    assert len(streamed) == 4  # two 1000-byte blocks of the image a chunk
    assert list(stream_chunks(iter([]), 100)) == [([], True)]


class _Uneven(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wide = torch.nn.Parameter(torch.randn(10, 3))
        self.vector = torch.nn.Parameter(torch.randn(5))
        self.single = torch.nn.Parameter(torch.randn(1, 4))
        self.cube = torch.nn.Parameter(torch.randn(7, 2, 3))


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_local_shards_match_fsdp2_layout(world: int) -> None:
    """FSDP2's real local shards (fake process group) sit where ``shard_rows`` says, and the
    blocks of all ranks tile every tensor exactly once."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.manual_seed(0)
    full = {n: p.detach().to(torch.bfloat16) for n, p in _Uneven().named_parameters()}
    covered = {n: torch.zeros(t.shape[0], dtype=torch.int) for n, t in full.items()}
    for rank in range(world):
        dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
        try:
            mesh = dist.device_mesh.init_device_mesh("cpu", (world,))
            torch.manual_seed(0)
            model = shard_for_training(_Uneven(), mesh, "bfloat16")
            shards = local_bf16_shards(model)  # raises if FSDP2's rows differ from ours
        finally:
            dist.destroy_process_group()
        for part in encode_shard(shards, None, chunk_bytes=16, dense_threshold=1.0):
            head = part.header
            rows = slice(head.row_offset, head.row_offset + head.rows)
            expected = full[head.name][rows].contiguous().view(torch.int16).reshape(-1).numpy()
            np.testing.assert_array_equal(np.frombuffer(part.values, np.int16), expected)
            covered[head.name][rows] += 1
    for name, count in covered.items():
        assert count.eq(1).all(), name


def test_a_burst_pool_encodes_and_applies_what_one_thread_does() -> None:
    """The publisher's blocks encoded on a pool's threads are the one-thread parts, in order;
    a subscriber applies a step's parts on a pool only where their rows are disjoint (two
    parts writing one row, which only a malformed message has, go one after another)."""
    from concurrent.futures import ThreadPoolExecutor

    import msgspec

    from streamrl.workers.generation.subscriber import _overlapping
    from streamrl.workers.learning.shard_image import LocalShard

    old = {f"w{i}": LocalShard(bits(4000, seed=i), (40, 100), 0) for i in range(5)}
    new = {n: LocalShard(changed(s.bits, 0.05, seed=7), s.full_shape, 0) for n, s in old.items()}
    serial = encode_shard(new, old, chunk_bytes=2000, dense_threshold=0.25)
    with ThreadPoolExecutor(2) as pool:
        pooled = encode_shard(new, old, chunk_bytes=2000, dense_threshold=0.25, pool=pool)
    assert [p.header for p in pooled] == [p.header for p in serial] and len(serial) == 5 * 4
    assert not _overlapping(serial)
    twice = EncodedPart(msgspec.structs.replace(serial[0].header, rows=11), b"")
    assert _overlapping([serial[0], serial[1], twice])  # rows 0-10 of w0 written twice


@pytest.mark.parametrize(("fraction", "encoding"), [(0.02, "sparse"), (0.2, "bitmap")])
def test_changed_elements_name_what_each_applied_part_wrote(fraction: float, encoding: str) -> None:
    """Rows 2-5 and 6-9 of a [10, 5000] tensor, applied in place: the positions the records
    name, shifted by the rows before them, are exactly the elements that differ; a tensor
    with a dense part is left out (copied whole), and a second step's positions add on."""
    old = bits(50_000).reshape(10, 5000)
    new = changed(old.reshape(-1), fraction).reshape(10, 5000)
    image = old.copy()
    records = []
    for start in (2, 6):
        block = image[start : start + 4].reshape(-1)
        part = encode_part(
            "w",
            new[start : start + 4].reshape(-1),
            block.copy(),
            full_shape=(10, 5000),
            row_offset=start,
            rows=4,
            dense_threshold=0.5,
        )
        assert part.header.encoding == encoding
        records.append(apply_in_place(part, block))
    found = changed_elements(records)
    differs = np.flatnonzero((image != old).reshape(-1))
    np.testing.assert_array_equal(np.sort(found["w"]), differs)
    assert found["w"].size == differs.size  # counted from the headers, nothing decoded
    assert differs.min() >= 2 * 5000
    # The same rows changed again: both steps' positions (one position may come twice).
    block = image[2:6].reshape(-1)
    again = changed(block, fraction, seed=7)
    second_step = np.flatnonzero(again != block) + 2 * 5000
    second = encode_part(
        "w", again, block.copy(), full_shape=(10, 5000), row_offset=2, rows=4, dense_threshold=0.5
    )
    both = changed_elements([*records, apply_in_place(second, block)])["w"]
    np.testing.assert_array_equal(np.unique(both), np.union1d(differs, second_step))
    # A dense part anywhere in a tensor: no positions for it.
    dense = encode_part(
        "w",
        bits(20_000, 3),
        image[2:6].reshape(-1).copy(),
        full_shape=(10, 5000),
        row_offset=2,
        rows=4,
        dense_threshold=0.5,
    )
    assert dense.header.encoding == "dense"
    assert changed_positions(dense, 20_000) is None
    assert changed_elements([*records, apply_in_place(dense, image[2:6].reshape(-1))]) == {}


def test_an_engine_copy_goes_by_positions_only_for_tensors_it_holds_whole() -> None:
    """``EngineCopy``: nothing by positions until an adoption marks a tensor held; a tensor
    that moved outside the records (``exclude``) goes whole; disabled, no positions at all."""
    from streamrl.workers.generation.engine_copy import EngineCopy

    old = bits(5000)
    new = changed(old, 0.02)
    block = old.copy()
    part = encode_part(
        "a", new, block.copy(), full_shape=(5000,), row_offset=0, rows=5000, dense_threshold=0.5
    )
    records = [apply_in_place(part, block)]
    copy = EngineCopy(enabled=True)
    assert copy.positions(records, ["a"]) == {}  # loaded from the model: not the image
    mark = copy.on_adopt(["a"])
    assert copy.positions(records, ["a"]) == {}  # prepared, not adopted yet
    mark()
    np.testing.assert_array_equal(copy.positions(records, ["a"])["a"], np.flatnonzero(new != old))
    assert copy.positions(records, ["a"], exclude={"a"}) == {}
    assert EngineCopy(enabled=False).positions(records, ["a"]) is None
