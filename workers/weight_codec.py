"""Lossless bf16 diff encoding shared by the publisher and the subscriber (docs/design.md §4).

Unit of encoding: a *block*, a run of whole dim-0 rows of one learner rank's FSDP2 shard of
one tensor (``row_blocks`` cuts a shard so that no block exceeds the chunk size, which keeps
every ZeroMQ message bounded). A block's new bf16 image is compared bitwise (as int16) with
the last published one, and the changed elements travel in one of three encodings, whichever
is smallest for that block:

- ``sparse``: a byte per 255-element window (how many of its elements changed), then a byte per
  change (its offset in its window), then the new values (``sparse_index``). About 1.2
  bytes per change at 2% density, 1.8 at 0.5%, and never the 4 bytes of a raw uint32 index
  (``benchmarks/weights.py`` measures the alternatives);
- ``bitmap``: one bit per element of the block (smaller than the sparse index above ~12%
  changed);
- ``dense``: the whole block (above ``dense_threshold`` changed, or when it is simply smaller).

Values are raw bf16 bytes: applying a diff reproduces the publisher's image bit for bit.

Checksum: XXH3-64 of the complete new bf16 bytes of the block, i.e. per (tensor, learner rank,
row block), not per full tensor. That is deliberate: each rank publishes its own shard without
gathering the tensor (docs/design.md §4), so no rank ever holds the bytes a full-tensor hash needs;
a per-block hash is as strong and is checked where the block is applied.

Whole-image checksum (``image_checksum``): a per-block hash is checked only when a diff touches
the block, so a block that diverged silently and never changes again would go unnoticed. Every
``weights.verify_every`` versions each rank also sends XXH3-64 of each of its tensors' rows and
XXH3-64 of those digests; the subscriber recomputes them over its copy (17 ms for the 270 MB
of SmolLM2-135M on one AVX-512 core: every byte is hashed again, nothing cached is trusted).
XXH3 rather than xxh64: 17 ms against 43 ms for those 270 MB (Intel Xeon, AVX512), and every
version is hashed twice, by the publisher and by each subscriber.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
import xxhash

from streamrl.protocol import TensorPart
from streamrl.workers.sparse_index import decode_positions


def as_i16(t: torch.Tensor) -> np.ndarray:
    """The bf16 tensor's bits as a flat int16 numpy view (no copy for a contiguous CPU tensor)."""
    return t.detach().contiguous().view(torch.int16).reshape(-1).numpy()


def checksum(bits: np.ndarray | bytes | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(bits)


def image_digests(pieces: list[np.ndarray]) -> np.ndarray:
    """XXH3-64 of each piece (flat int16 bits), as little-endian uint64s."""
    return np.array([checksum(p) for p in pieces], dtype="<u8")


def image_checksum(digests: np.ndarray | bytes) -> int:
    """One checksum of a whole shard from its pieces' ``image_digests``, in their order."""
    return checksum(digests)  # the same bytes either way: the digests as little-endian uint64s


def row_blocks(rows: int, row_elems: int, max_bytes: int) -> list[tuple[int, int]]:
    """Cut ``rows`` rows of ``row_elems`` bf16 elements into ``[start, stop)`` blocks of at most
    ``max_bytes`` each (a single row larger than that stays one block). Deterministic, so the
    publisher's diffs and anchors always cut a shard the same way."""
    per_block = max(1, max_bytes // max(2 * row_elems, 1))
    return [(a, min(a + per_block, rows)) for a in range(0, rows, per_block)]


def shard_rows(full_rows: int, rank: int, world: int) -> tuple[int, int]:
    """Row range ``[start, stop)`` of ``rank``'s dim-0 shard under FSDP2's ``torch.chunk`` split:
    every rank gets ``ceil(n/world)`` rows except the tail, and trailing ranks may get none
    (10 rows on 3 ranks: 4, 4, 2; 5 rows on 4 ranks: 2, 2, 1, 0)."""
    per_rank = -(-full_rows // world)
    start = min(rank * per_rank, full_rows)
    return start, min(start + per_rank, full_rows)


# --------------------------------------------------------------------------- parts

Buffer = bytes | memoryview | np.ndarray


@dataclass(frozen=True)
class EncodedPart:
    """A ``TensorPart`` header (its ``values``/``indices`` left empty) plus its payload, which
    travels as separate zero-copy ZeroMQ frames instead of inside the msgpack header."""

    header: TensorPart
    values: Buffer
    indices: Buffer = b""

    @classmethod
    def inline(cls, part: TensorPart) -> EncodedPart:
        """A part received with its payload inside the header (single-frame messages)."""
        return cls(part, part.values, part.indices)

    @property
    def nbytes(self) -> int:
        return memoryview(self.values).nbytes + memoryview(self.indices).nbytes

    @property
    def image_bytes(self) -> int:
        """The bf16 bytes of the rows this part covers (its payload is at most that)."""
        return 2 * self.header.rows * max(math.prod(self.header.full_shape[1:]), 1)


def _header(name, full_shape, row_offset, rows, encoding, bits, num_changed) -> TensorPart:
    return TensorPart(
        name=name,
        full_shape=full_shape,
        row_offset=row_offset,
        rows=rows,
        encoding=encoding,
        values=b"",
        checksum=checksum(bits),
        num_changed=num_changed,
    )


def encode_part(
    name: str,
    new: np.ndarray,
    old: np.ndarray | None,
    *,
    full_shape: tuple[int, ...],
    row_offset: int,
    rows: int,
    dense_threshold: float,
    source: np.ndarray | None = None,
) -> EncodedPart | None:
    """Encode one block (``new``/``old``: flat int16 bits of the block's bf16 image, ``old=None``
    for a snapshot). Returns ``None`` when nothing changed: the block is left out of the diff.
    ``row_offset`` is the block's first row in the full tensor. ``source``: the block's
    float32 masters, from which ``new`` is written first (in the diff's own pass where it
    can: ``diff_kernels.sparse_diff``)."""
    head = (name, full_shape, row_offset, rows)
    if old is None:
        if source is not None:  # no caller takes a first image this way (shard_image)
            raise ValueError(f"{name}: masters to take without the image before them")
        return EncodedPart(_header(*head, "dense", new, new.size), new)
    # Imported here: numba (llvmlite, ~70 MB) loads only in processes that encode or apply
    # sparse parts (vLLM's engine construction needs ``vllm_engine.llvmlite_scannable`` then).
    from streamrl.workers.diff_kernels import sparse_diff

    found = sparse_diff(new, old, limit=int(dense_threshold * new.size), source=source)
    if found is None:  # more than dense_threshold changed
        return EncodedPart(_header(*head, "dense", new, int(np.count_nonzero(new != old))), new)
    sparse, values = found
    num_changed = values.size
    if num_changed == 0:
        return None
    if math.ceil(new.size / 8) < sparse.size:
        encoding, indices = "bitmap", np.packbits(new != old)
    else:
        encoding, indices = "sparse", sparse
    if indices.nbytes + values.nbytes >= new.nbytes:
        return EncodedPart(_header(*head, "dense", new, num_changed), new)
    return EncodedPart(_header(*head, encoding, new, num_changed), values, indices)


# What ``undo`` needs to put a block back: the part applied and the old values it replaced
# (the whole old block for a dense part). The part also says which elements it changed
# (``changed_positions``).
Undo = tuple["EncodedPart", np.ndarray]


def apply_in_place(part: EncodedPart, block: np.ndarray) -> Undo:
    """Apply ``part`` to ``block`` (the flat, writable int16 bits of its rows) in place and
    verify the checksum of the result. Returns what ``undo`` needs to restore the block. On a
    malformed part or a checksum mismatch the block is left as it was and ``ValueError`` is
    raised."""
    head, total = part.header, block.size
    if head.encoding == "dense":
        new = np.frombuffer(part.values, dtype="<i2")
        if new.size != total:
            raise ValueError(f"{head.name}: dense size {new.size} != block size {total}")
        if checksum(new) != head.checksum:  # verified before anything is written
            raise ValueError(f"{head.name}[{head.row_offset}:]: checksum mismatch")
        old = block.copy()
        block[:] = new
        return part, old
    values = np.frombuffer(part.values, dtype="<i2")
    if head.encoding == "sparse":
        # Imported here, as in ``encode_part``: the compiled pass (diff_kernels' module doc).
        from streamrl.workers.diff_kernels import apply_sparse

        try:
            old = apply_sparse(np.frombuffer(part.indices, dtype=np.uint8), values, block)
        except ValueError as exc:
            raise ValueError(f"{head.name}: {exc}") from None
    else:
        positions = _bitmap_positions(part, total)
        if positions.size != values.size:
            raise ValueError(f"{head.name}: {positions.size} positions for {values.size} values")
        old = block[positions]
        block[positions] = values
    record = (part, old)
    if checksum(block) != head.checksum:
        undo(block, record)
        raise ValueError(f"{head.name}[{head.row_offset}:]: checksum mismatch")
    return record


def changed_positions(part: EncodedPart, size: int) -> np.ndarray | None:
    """The flat positions (int64) in its block of ``size`` elements that an applied ``part``
    wrote; None for a dense part (every element). Example: a sparse part naming positions 3
    and 300 -> [3, 300]."""
    encoding = part.header.encoding
    if encoding == "dense":
        return None
    if encoding == "sparse":
        return decode_positions(part.indices, size)
    return _bitmap_positions(part, size)


class ChangedElements:
    """The elements of one tensor that applied parts (none of them dense) wrote: ``size``
    counted from their headers, the flat positions in the whole (unsharded) tensor decoded
    only when asked (``np.asarray``), since an engine that copies the tensor whole needs only
    the count. A position two steps changed comes twice. Example: parts of rows 2-3 of a
    [4, 10] tensor naming positions 1 and 12 of their block -> size 2, positions [21, 32]."""

    def __init__(self, records: list[Undo]) -> None:
        self._records = records
        # From the headers: it picks how to copy, never which elements (those are decoded).
        self.size = sum(part.header.num_changed for part, _ in records)
        self._positions: np.ndarray | None = None

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        if self._positions is None:
            pieces = [np.empty(0, np.int64)]
            for part, _ in self._records:
                head = part.header
                row_len = math.prod(head.full_shape[1:])
                found = changed_positions(part, head.rows * row_len)
                pieces.append(found + head.row_offset * row_len)
            self._positions = np.concatenate(pieces)
        return self._positions if dtype is None else self._positions.astype(dtype)


def changed_elements(records: Iterable[Undo]) -> dict[str, ChangedElements]:
    """Per tensor, what these applied parts wrote (``ChangedElements``), for each tensor all
    of whose parts name their positions; a tensor with a dense part is left out (a block
    changed whole is cheaper to copy whole)."""
    by_name: dict[str, list[Undo]] = {}
    whole: set[str] = set()
    for record in records:
        head = record[0].header
        if head.encoding == "dense":
            whole.add(head.name)
        else:
            by_name.setdefault(head.name, []).append(record)
    return {name: ChangedElements(r) for name, r in by_name.items() if name not in whole}


def _bitmap_positions(part: EncodedPart, total: int) -> np.ndarray:
    head = part.header
    if head.encoding != "bitmap":
        raise ValueError(f"{head.name}: unknown encoding {head.encoding!r}")
    packed = np.frombuffer(part.indices, dtype=np.uint8)
    if packed.size != math.ceil(total / 8):
        raise ValueError(f"{head.name}: bitmap of {packed.size} bytes for {total}")
    return np.flatnonzero(np.unpackbits(packed, count=total))


def undo(block: np.ndarray, record: Undo) -> None:
    part, old = record
    if part.header.encoding == "dense":
        block[:] = old
    elif part.header.encoding == "sparse":
        from streamrl.workers.diff_kernels import undo_sparse

        undo_sparse(np.frombuffer(part.indices, dtype=np.uint8), old, block)
    else:
        block[_bitmap_positions(part, block.size)] = old


def apply_part(part: EncodedPart, old: np.ndarray) -> np.ndarray:
    """The block's new bits after applying ``part`` to ``old`` (a copy; ``old`` is unchanged)."""
    new = old.copy()
    apply_in_place(part, new)
    return new
