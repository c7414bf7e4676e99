"""The weight stream: a version as ``WeightDiff`` parts (sparse or dense rows of a tensor,
bf16 bytes) or a whole ``WeightAnchor``, the image's checksum, and a subscriber's
``AnchorRequest`` for a repair."""

from __future__ import annotations

from typing import Literal

import msgspec

# Elements per window of a sparse part's index: a window's count and offsets fit a byte.
SPARSE_WINDOW = 255


class TensorPart(msgspec.Struct):
    """Rows ``[row_offset, row_offset + rows)`` of one tensor (a block of one learner rank's
    dim-0 shard; large shards are cut into several blocks), for one version.

    ``encoding``: ``dense`` (``values`` holds the whole block), ``sparse`` (``indices`` are the
    block's changed positions, a byte per ``SPARSE_WINDOW``-element window counting them then
    a byte per position for its offset in its window: ``sparse_index.encode_positions``;
    ``values`` the new bf16 values at them) or ``bitmap`` (``indices`` is a packed bitmap over
    the block's elements).
    ``checksum`` is XXH3-64 of the complete new bf16 block, verified after applying.
    """

    name: str
    full_shape: tuple[int, ...]
    row_offset: int
    rows: int
    encoding: Literal["dense", "sparse", "bitmap"]
    values: bytes
    checksum: int
    indices: bytes = b""
    num_changed: int = 0


class ImageChecksum(msgspec.Struct):
    """Whole-image checksum of one learner rank's shard at a diff's version (docs/design.md §4,
    ``weights.verify_every``): catches a block that diverged silently and that no diff touches
    again, which the per-block checksums never see. The shard is ``names[i]``'s rows
    ``[row_offsets[i], row_offsets[i] + rows[i])`` in this order; ``digests`` holds XXH3-64 of
    each of those row ranges' bf16 bytes (little-endian uint64s, one per name) and ``checksum``
    is XXH3-64 of ``digests``."""

    names: list[str]
    row_offsets: list[int]
    rows: list[int]
    digests: bytes
    checksum: int


class WeightDiff(msgspec.Struct, tag="weight_diff"):
    """Version ``version`` of one rank's shard as a diff against ``base_version`` (``version -
    1`` unless the publisher coalesced versions it could not send in time)."""

    version: int
    base_version: int
    rank: int
    world_size: int
    parts: list[TensorPart]
    published_at: float
    chunk: int = 0
    # How many chunks the version has; the publisher streams a diff's chunks as it encodes
    # them, so only the last carries the count and the ones before it say 0.
    num_chunks: int = 1
    # True: each part's values and indices follow this header as two extra ZeroMQ frames, in
    # part order (sent zero-copy); the header's parts then carry empty ``values``/``indices``.
    payload_frames: bool = False
    # On the last chunk of a version the publisher verifies (every ``weights.verify_every``
    # versions, and when a checkpoint is saved): the rank's whole shard after this version.
    image_checksum: ImageChecksum | None = None


class WeightAnchor(msgspec.Struct, tag="weight_anchor"):
    """A full snapshot of one rank's shard at ``version`` (dense parts only)."""

    version: int
    rank: int
    world_size: int
    parts: list[TensorPart]
    published_at: float
    chunk: int = 0
    num_chunks: int = 1
    payload_frames: bool = False  # as in ``WeightDiff``


class AnchorRequest(msgspec.Struct, tag="anchor_request"):
    subscriber_id: int


WeightMessage = WeightDiff | WeightAnchor
