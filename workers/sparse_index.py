"""The weight codec's sparse index: which elements of a block changed (docs/design.md §4).

One byte per ``WINDOW``-element window (how many positions fall in it), then one byte per
position (its offset in its window): ``ceil(size / 255) + k`` bytes for ``k`` positions.
Example: positions [3, 300] in 600 elements -> counts [1, 1, 0], offsets [3, 45].

Why windows of bytes and not varint gaps: both sides are a few vectorised passes over the
``k`` positions (a ``bincount``, a ``repeat``) instead of one masked pass per varint byte, and
the size stays close. On SmolLM2-135M's real diffs (2% changed) encoding and decoding the
positions took 34 ms a version against 116 ms for LEB128 gaps, and the diff grew from 8.1 to
8.2 MB (Intel Xeon, one core; docs/experiments.md, 2026-12-02).

This module owns the format and its checks; ``weight_codec`` (numpy) and ``diff_kernels``
(the compiled passes, which write and read the same bytes) both build on it.
"""

from __future__ import annotations

import numpy as np

from streamrl.protocol import SPARSE_WINDOW as WINDOW


def window_count(size: int) -> int:
    return -(-size // WINDOW)


def encode_positions(positions: np.ndarray, size: int) -> bytes:
    """Sorted distinct flat positions in a block of ``size`` elements -> the sparse index."""
    windows, offsets = np.divmod(positions.astype(np.int64, copy=False), WINDOW)
    counts = np.bincount(windows, minlength=window_count(size))
    return counts.astype(np.uint8).tobytes() + offsets.astype(np.uint8).tobytes()


def split_index(data: bytes | memoryview | np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """A sparse index's per-window counts and its offsets (uint8 views), for a block of
    ``size`` elements. Raises ``ValueError`` unless every position it names lies in the block
    and in its own window: too few bytes for the windows, counts that name more or fewer
    offsets than it holds, an offset past its window, a position past the block's end."""
    raw = np.frombuffer(data, dtype=np.uint8)
    n_windows = window_count(size)
    if raw.size < n_windows:
        raise ValueError(f"sparse index of {raw.size} bytes for {n_windows} windows")
    counts, offsets = raw[:n_windows], raw[n_windows:]
    if int(counts.sum(dtype=np.int64)) != offsets.size:
        raise ValueError(f"sparse index counts {int(counts.sum())} offsets, holds {offsets.size}")
    if offsets.size and int(offsets.max()) >= WINDOW:
        raise ValueError(f"an offset of {int(offsets.max())} in a window of {WINDOW}")
    # Only the last window can reach past the block (every other one is whole).
    last = offsets[offsets.size - int(counts[-1]) :] if n_windows else offsets[:0]
    furthest = (n_windows - 1) * WINDOW + int(last.max()) if last.size else -1
    if furthest >= size:
        raise ValueError(f"position {furthest} beyond a block of {size}")
    return counts, offsets


def decode_positions(data: bytes | memoryview, size: int) -> np.ndarray:
    """Inverse of ``encode_positions`` (int64 flat positions); raises ``ValueError`` as
    ``split_index`` does."""
    counts, offsets = split_index(data, size)
    starts = np.repeat(np.arange(counts.size, dtype=np.int64) * WINDOW, counts)
    return starts + offsets
