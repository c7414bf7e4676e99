"""Compiled compaction for the weight codec's sparse encoding (numba; docs/design.md §4).

What numpy cannot do in one pass: find the elements of a block whose bf16 bits changed and
write them out as the codec's sparse form (a count per 255-element window, an offset per
change, the new values). In numpy that is a compare (a bool array the block's size), a
``flatnonzero`` over it, a ``divmod``/``bincount`` for the index and a gather: four passes and
two block-sized temporaries. Here it is one pass that reads each image once.

Two forms of that pass, the same bytes out (``tests/unit/test_diff_kernels.py`` holds both to
the numpy reference):

- **Vectors** (``_emit_vectors``, where numba targets x86 with AVX2 or better): 32 elements
  a step; the changed lanes' values and window offsets are packed to the front and stored
  whole, and the output advances by the mask's popcount. With AVX-512 VBMI2 the packing is
  LLVM's ``vector.compress`` (one ``vpcompressw``/``vpcompressb``); without it, four byte
  shuffles of 8 lanes each from a 256-row table (``_shuffle_compress``), since LLVM's own
  expansion of the compress took 250 ms for SmolLM2's images on an AMD EPYC with AVX2 only,
  five times the word loop at 0.5%. No branch depends on the data, so its time is the two
  images' read whatever the density: SmolLM2-135M-sized blocks (135M elements in 8M-element
  blocks, random changes) took 48 / 52 / 63 ms at 0.5 / 2.3 / 10% changed, against 57 /
  107 / 315 ms for the word loop below, on one thread of an Intel Xeon with AMX (VBMI2); by
  table on the AVX2-only EPYC, 49 / 47 / 55 ms against 37 / 68 / 232 ms (docs/experiments.md,
  2026-12-06 session 21 and 2026-12-07 session 26). ``NUMBA_CPU_NAME=haswell`` alone does not
  make a host an AVX2 one: numba keeps the host's features unless ``NUMBA_CPU_FEATURES``
  names them (``tests/unit/test_diff_kernels.py``'s ``AVX2_ONLY``).
- **Words** (``_emit_words``, every other target): reads the images 64 bits at a time and
  stops at a word only when it changed. Its branches follow the data, which costs ~25 ns a
  changed word on the Xeon (half that on an AMD EPYC: 63-67 ms for the real diff at 1.8%,
  against numpy's 113-121 ms, docs/experiments.md, 2026-12-04 session 5). Without AVX2
  (``NUMBA_CPU_NAME=generic``) LLVM unrolls the compress lane by lane and the vectors lose
  (200 ms at 2.3%), so the words stay there.

Where the new image is still to be made from float32 masters (a learner rank's host
parameters, ``shard_image.take_image``), the vector pass makes it too (``sparse_diff``'s
``source``): each step rounds 32 masters to bf16 in registers (``_cast_lanes``), stores them
and compares them, so the new image is written once and never read back. SmolLM2-135M, two
threads of an Intel Xeon with AMX: 0.082 s against 0.126-0.141 s for torch's cast then the
diff (docs/experiments.md, 2026-12-06 session 23). The words pass casts with torch first.

Applying a sparse part (``apply_sparse``, ``weight_codec.apply_in_place``) is one pass too:
each changed position decoded from its window's count and offset, its old value kept for the
undo and the new one written. numpy decodes the positions, gathers the old values and
scatters the new in three passes: 17 / 60 / 110 ms for SmolLM2-sized diffs at 0.5 / 2.3 /
10% changed (as above) against 11 / 26 / 44 ms here, on one thread of an Intel Xeon with AMX
(``benchmarks/diff_kernels.py``); the checksum of each block written (22 ms) is the same
either way. (On an AMD EPYC an earlier compiled apply measured no better than numpy: 30 ms
against 31 for a real diff at 1.8%.)

Example: ``new = [5, 7, 9]``, ``old = [5, 6, 9]`` -> counts ``[1]``, offsets ``[1]``, values
``[7]``.

Each kernel compiles on first use and is cached on disk beside this file (or in numba's
user cache where that is not writable; numba keys it by the CPU it was compiled for), so a
process pays the compile (~1 s) once per machine. ``weight_codec`` imports this module where
it encodes or applies a sparse part, so numba loads only in processes that do.
"""

from __future__ import annotations

import llvmlite.binding
import numba
import numpy as np
import torch
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from streamrl.protocol import SPARSE_WINDOW as WINDOW
from streamrl.workers.sparse_index import split_index, window_count

LANES = 32  # elements a vector step compares: 64 bytes of bf16, one AVX-512 register

_LANE = np.uint64(0xFFFF)


@numba.njit(nogil=True, cache=True)
def _emit_scalar(new, old, lo, hi, index, nwin, values, k, limit):  # pragma: no cover - numba
    for i in range(lo, hi):
        if new[i] != old[i]:
            if k == limit:
                return -1
            win = i // WINDOW
            index[win] += 1
            index[nwin + k] = i - win * WINDOW
            values[k] = new[i]
            k += 1
    return k


@numba.njit(nogil=True, cache=True)
def _emit_words(new64, old64, first, index, nwin, values, k, limit):  # pragma: no cover
    # Four bf16 values per 64-bit word; a word that did not change costs one compare and a
    # well-predicted branch. Little-endian: lane j holds element first + 4q + j.
    for q in range(new64.size):
        word = new64[q]
        flips = word ^ old64[q]
        if flips != 0:
            i0 = first + 4 * q
            for j in range(4):
                shift = np.uint64(16 * j)
                if (flips >> shift) & _LANE:
                    if k == limit:
                        return -1
                    i = i0 + j
                    win = i // WINDOW
                    index[win] += 1
                    index[nwin + k] = i - win * WINDOW
                    values[k] = np.uint16((word >> shift) & _LANE)
                    k += 1
    return k


# ---------------------------------------------------------------------------- vectors


def _vector_pointer(context, builder, array_type, array, index):
    """A pointer to ``LANES`` elements of ``array`` from ``index`` on, as one LLVM vector."""
    data = context.make_array(array_type)(context, builder, array).data
    lanes = ir.VectorType(data.type.pointee, LANES)
    return builder.bitcast(builder.gep(data, [index]), lanes.as_pointer())


@intrinsic
def _changed_mask(typingctx, new, old, i):
    """Bit j set where ``new[i + j] != old[i + j]``, for j < ``LANES``."""

    def codegen(context, builder, signature, args):
        a = builder.load(
            _vector_pointer(context, builder, signature.args[0], args[0], args[2]), align=1
        )
        b = builder.load(
            _vector_pointer(context, builder, signature.args[1], args[1], args[2]), align=1
        )
        flags = builder.icmp_unsigned("!=", a, b)
        return builder.zext(builder.bitcast(flags, ir.IntType(LANES)), ir.IntType(64))

    return types.uint64(new, old, i), codegen


@intrinsic
def _compress_store(typingctx, source, i, mask, target, k):
    """Store the lanes of ``source[i : i + LANES]`` whose ``mask`` bit is set, in order, at
    ``target[k:]``; writes ``LANES`` elements there whatever the mask (the caller leaves room)."""

    def codegen(context, builder, signature, args):
        pointer = _vector_pointer(context, builder, signature.args[0], args[0], args[1])
        lanes = pointer.type.pointee
        target = _vector_pointer(context, builder, signature.args[3], args[3], args[4])
        if not NATIVE_COMPRESS:
            _shuffle_compress(builder, pointer, args[2], target, lanes.element.width)
            return context.get_dummy_value()
        flags = builder.bitcast(
            builder.trunc(args[2], ir.IntType(LANES)), ir.VectorType(ir.IntType(1), LANES)
        )
        name = f"llvm.experimental.vector.compress.v{LANES}i{lanes.element.width}"
        try:
            compress = builder.module.get_global(name)
        except KeyError:
            compress = ir.Function(
                builder.module, ir.FunctionType(lanes, [lanes, flags.type, lanes]), name
            )
        packed = builder.call(
            compress, [builder.load(pointer, align=1), flags, ir.Constant(lanes, ir.Undefined)]
        )
        builder.store(packed, target, align=1)
        return context.get_dummy_value()

    return types.void(source, i, mask, target, k), codegen


_BYTES = ir.VectorType(ir.IntType(8), 16)
_GROUP = 8  # lanes a shuffle packs: 8 bf16 values or 8 window offsets, within 16 bytes


def _shuffle_table(width: int) -> np.ndarray:
    """Row m: the byte shuffle (``pshufb``) that packs the ``width``-bit lanes of an 8-lane
    group whose bit is set in m to the front, in order (0x80 zeroes a byte)."""
    size = width // 8
    table = np.full((256, 16), 0x80, np.uint8)
    for m in range(256):
        picked = [size * j + b for j in range(_GROUP) if m >> j & 1 for b in range(size)]
        table[m, : len(picked)] = picked
    return table


def _shuffle_compress(builder: ir.IRBuilder, source, mask, target, width: int) -> None:
    """``vector.compress`` and its store, as four table-driven byte shuffles of 8 lanes each
    (module doc): where the CPU has no compress instruction, LLVM's own expansion of it took
    250 ms for SmolLM2's images on an AMD EPYC with AVX2 only. Each group's 16-byte store
    goes where the group before ended; the caller leaves room past the last."""
    module = builder.module
    table_name = f"streamrl_compress_table_{width}"
    try:
        table = module.get_global(table_name)
    except KeyError:
        rows = _shuffle_table(width)
        kind = ir.ArrayType(_BYTES, 256)
        table = ir.GlobalVariable(module, kind, table_name)
        table.initializer = ir.Constant(
            kind, [ir.Constant(_BYTES, [int(b) for b in row]) for row in rows]
        )
        table.global_constant = True
        table.linkage = "internal"
        table.align = 16
    shuffle_name = "llvm.x86.ssse3.pshuf.b.128"
    try:
        shuffle = module.get_global(shuffle_name)
    except KeyError:
        shuffle = ir.Function(module, ir.FunctionType(_BYTES, [_BYTES, _BYTES]), shuffle_name)
    byte = ir.IntType(8).as_pointer()
    source, target = builder.bitcast(source, byte), builder.bitcast(target, byte)
    i64 = ir.IntType(64)
    size = width // 8
    written = ir.Constant(i64, 0)  # bytes stored so far
    for g in range(LANES // _GROUP):
        bits = builder.and_(builder.lshr(mask, ir.Constant(i64, _GROUP * g)), ir.Constant(i64, 255))
        row = builder.load(builder.gep(table, [ir.Constant(i64, 0), bits]), align=16)
        group = builder.bitcast(
            builder.gep(source, [ir.Constant(i64, _GROUP * size * g)]), _BYTES.as_pointer()
        )
        packed = builder.call(shuffle, [builder.load(group, align=1), row])
        out = builder.bitcast(builder.gep(target, [written]), _BYTES.as_pointer())
        builder.store(packed, out, align=1)
        written = builder.add(written, builder.mul(builder.ctpop(bits), ir.Constant(i64, size)))


@intrinsic
def _popcount(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.ctpop(args[0])

    return types.uint64(x), codegen


# Row b: the window offsets of LANES consecutive elements whose first sits at offset b.
# Padded by 8: a shuffle reads 16 bytes for its 8 offsets (``_shuffle_compress``).
_OFFSETS = np.concatenate(
    [
        ((np.arange(WINDOW)[:, None] + np.arange(LANES)) % WINDOW).astype(np.uint8).ravel(),
        np.zeros(8, np.uint8),
    ]
)


@intrinsic
def _cast_lanes(typingctx, source, new, i):
    """``new[i : i + LANES]`` := the bf16 bits of the float32 bits ``source[i : i + LANES]``,
    rounded to nearest even, any NaN as 0xFFFF: what torch's ``.to(torch.bfloat16)`` makes
    on the CPU with its AVX2 and AVX-512 kernels (its scalar one makes NaNs 0x7FC0;
    ``tests/unit/test_diff_kernels.py`` holds the two to each other, denormals and infinities
    included). In 32 bits: only a NaN's bits can wrap, and it is replaced."""

    def codegen(context, builder, signature, args):
        bits = builder.load(
            _vector_pointer(context, builder, signature.args[0], args[0], args[2]), align=1
        )
        lanes = bits.type

        def splat(value: int) -> ir.Constant:
            return ir.Constant(lanes, [ir.Constant(lanes.element, value)] * LANES)

        odd = builder.and_(builder.lshr(bits, splat(16)), splat(1))  # ties to the even one
        rounded = builder.lshr(builder.add(builder.add(bits, odd), splat(0x7FFF)), splat(16))
        nan = builder.icmp_unsigned(">", builder.and_(bits, splat(0x7FFFFFFF)), splat(0x7F800000))
        out = builder.trunc(builder.select(nan, splat(0xFFFF), rounded), _HALVES)
        builder.store(
            out, _vector_pointer(context, builder, signature.args[1], args[1], args[2]), align=1
        )
        return context.get_dummy_value()

    return types.void(source, new, i), codegen


_HALVES = ir.VectorType(ir.IntType(16), LANES)


def _cast(source: np.ndarray, new: np.ndarray, start: int) -> None:
    """``new[start:]`` := bf16 bits of the float32 ``source[start:]``, by torch itself."""
    if start < new.size:
        torch.from_numpy(new[start:]).view(torch.bfloat16).copy_(torch.from_numpy(source[start:]))


@numba.njit(nogil=True, cache=True)
def _emit_vectors(new, old, stop, index, nwin, values, limit, offsets, source, cast):
    # pragma: no cover - numba
    # Elements [0, stop), stop a multiple of LANES. Each step stores LANES values and offsets
    # and keeps the changed ones (the rest are overwritten by the next step): no branch on
    # the data but the rare window crossing. ``cast``: first write the step's LANES elements
    # of ``new`` from ``source`` (float32 bits), so that the masters are read once and the
    # new image compared while it is still in L1.
    one = np.uint64(1)
    k = 0
    at = 0  # the offset of element i in its window
    win = 0
    for i in range(0, stop, LANES):
        if cast:
            _cast_lanes(source, new, i)
        mask = _changed_mask(new, old, i)
        _compress_store(new, i, mask, values, k)
        _compress_store(offsets, at * LANES, mask, index, nwin + k)
        changed = _popcount(mask)
        room = WINDOW - at
        if room < LANES:  # the step crosses into the next window
            here = _popcount(mask & ((one << np.uint64(room)) - one))
            index[win] += np.uint8(here)
            index[win + 1] += np.uint8(changed - here)
        else:
            index[win] += np.uint8(changed)
        k += changed
        if k > limit:
            return -1
        at += LANES
        if at >= WINDOW:
            at -= WINDOW
            win += 1
    return k


def _target_features() -> list[str]:
    """The features numba compiles for: ``NUMBA_CPU_FEATURES``, else this host's."""
    return (numba.config.CPU_FEATURES or llvmlite.binding.get_host_cpu_features().flatten()).split(
        ","
    )


def _vectors_pay() -> bool:
    """Whether numba compiles for x86 with AVX2 or better (module doc): the CPU name and
    features numba is configured with (``NUMBA_CPU_NAME``, ``NUMBA_CPU_FEATURES``), each
    this host's where unset. Never with an LLVM older than 19, which has no
    ``vector.compress`` (numba 0.60, which pyproject allows, brings LLVM 14)."""
    if tuple(llvmlite.binding.llvm_version_info) < (19,):
        return False
    if not llvmlite.binding.get_process_triple().startswith("x86_64"):
        return False
    if numba.config.CPU_NAME in ("generic", "x86-64", "x86-64-v2"):
        return False
    return "+avx2" in _target_features()


VECTORS = _vectors_pay()
# A compress instruction (AVX-512 VBMI2's ``vpcompressw``/``vpcompressb``) that LLVM emits for
# ``vector.compress``; without it the vector pass packs lanes by table (``_shuffle_compress``).
NATIVE_COMPRESS = "+avx512vbmi2" in _target_features()


# ---------------------------------------------------------------------------- the diff


def _aligned_head(new: np.ndarray, old: np.ndarray) -> int:
    """Elements before both arrays reach an 8-byte boundary (all of them when they never do)."""
    head = (-(new.ctypes.data // 2)) % 4
    if (new.ctypes.data - old.ctypes.data) % 8:
        return new.size
    return min(head, new.size)


def sparse_diff(
    new: np.ndarray,
    old: np.ndarray,
    limit: int,
    *,
    source: np.ndarray | None = None,
    vectors: bool = VECTORS,
) -> tuple[np.ndarray, np.ndarray] | None:
    """The changed elements of ``new`` against ``old`` (flat int16 bits of one block) as the
    codec's sparse index (uint8: one count per window, then one offset per change) and the
    new values (int16), or ``None`` when more than ``limit`` elements changed (the caller
    sends the block some other way and never pays for a sparse form it would not use).
    ``source``: the block's float32 masters (flat): ``new`` is first written as their bf16
    rounding, in the same pass where ``vectors`` (whole in any case, ``None`` or not).
    ``vectors``: which pass (module doc); both write the same bytes."""
    if new.shape != old.shape:
        raise ValueError(f"blocks of {new.size} and {old.size} elements")
    if source is not None and (source.dtype != np.float32 or source.shape != new.shape):
        raise ValueError(f"a {source.dtype} source of {source.size} for {new.size} elements")
    size = new.size
    nwin = window_count(size)
    # Room for a vector step's whole store past the last change (a shuffled group's store of
    # offsets reaches 16 bytes past the step's last one); pages past what is written are
    # never touched.
    index = np.empty(nwin + limit + LANES + 16, np.uint8)
    index[:nwin] = 0
    values = np.empty(limit + LANES, np.uint16)
    bits, base = new.view(np.uint16), old.view(np.uint16)
    if vectors:
        tail = size - size % LANES
        src = _NO_SOURCE if source is None else source.view(np.uint32)
        k = _emit_vectors(bits, base, tail, index, nwin, values, limit, _OFFSETS, src, src.size)
    else:
        if source is not None:
            _cast(source, new, 0)
        head = _aligned_head(bits, base)
        words = (size - head) // 4
        tail = head + 4 * words
        k = _emit_scalar(bits, base, 0, head, index, nwin, values, 0, limit)
        if words and k >= 0:
            new64, old64 = bits[head:tail].view(np.uint64), base[head:tail].view(np.uint64)
            k = _emit_words(new64, old64, head, index, nwin, values, k, limit)
    if source is not None and vectors:
        # The tail, or all that a pass stopped at ``limit`` left unwritten.
        _cast(source, new, tail if k >= 0 else 0)
    if k >= 0:
        k = _emit_scalar(bits, base, tail, size, index, nwin, values, k, limit)
    if k < 0:
        return None
    return index[: nwin + k], values[:k].view(np.int16)


_NO_SOURCE = np.empty(0, np.uint32)


def compile_kernels(*, encode: bool = True, apply: bool = True) -> None:
    """Compile (or load from numba's cache) the passes a process runs, so that its first
    version does not pay for them: ``encode``, what ``sparse_diff`` runs (a publisher);
    ``apply``, what ``apply_sparse`` and ``undo_sparse`` run (a subscriber)."""
    tiny = np.arange(2 * LANES + 9, dtype=np.int16)
    if encode:
        sparse_diff(tiny, tiny[::-1].copy(), limit=tiny.size)
        sparse_diff(tiny.copy(), tiny, limit=tiny.size, source=tiny.astype(np.float32))
    if apply:
        index = np.array([2, 0, 5], np.uint8)  # one window: positions 0 and 5
        values = -tiny[:2]
        block = tiny.copy()
        undo_sparse(index, apply_sparse(index, values, block), block)
        positions = np.array([0, 5], np.int64)
        copy_at(positions, tiny, block.view(np.uint16))
        copy_at(positions, tiny, np.empty(tiny.size, np.uint32))


# ---------------------------------------------------------------------------- applying


@numba.njit(nogil=True, cache=True)
def _apply_sparse(counts, offsets, values, block, old):  # pragma: no cover - numba
    k = 0
    for w in range(counts.size):
        base = w * WINDOW
        for _ in range(counts[w]):
            p = base + offsets[k]
            old[k] = block[p]
            block[p] = values[k]
            k += 1


@numba.njit(nogil=True, cache=True)
def _undo_sparse(counts, offsets, old, block):  # pragma: no cover - numba
    # Last change first: a position named twice (a malformed index) gets its first old value.
    k = offsets.size
    for w in range(counts.size - 1, -1, -1):
        base = w * WINDOW
        for _ in range(counts[w]):
            k -= 1
            block[base + offsets[k]] = old[k]


def apply_sparse(index: np.ndarray, values: np.ndarray, block: np.ndarray) -> np.ndarray:
    """Write ``values`` (int16) at the positions the sparse ``index`` (uint8, the codec's
    form) names in ``block`` (flat int16, in place); returns the old values there, for
    ``undo_sparse``. Raises ``ValueError`` on an index that does not fit, before writing."""
    counts, offsets = split_index(index, block.size)
    if offsets.size != values.size:
        raise ValueError(f"{offsets.size} positions for {values.size} values")
    old = np.empty(values.size, np.int16)
    _apply_sparse(counts, offsets, values, block, old)
    return old


def undo_sparse(index: np.ndarray, old: np.ndarray, block: np.ndarray) -> None:
    """Put back what ``apply_sparse`` replaced in ``block``."""
    counts, offsets = split_index(index, block.size)
    _undo_sparse(counts, offsets, old, block)


# ---------------------------------------------------------------------------- an engine's copy


@numba.njit(nogil=True, cache=True)
def _copy_at(positions, source, target):  # pragma: no cover - numba
    for i in range(positions.size):
        p = positions[i]
        target[p] = source[p]


@numba.njit(nogil=True, cache=True)
def _widen_at(positions, source, target):  # pragma: no cover - numba
    # bf16 -> fp32 is exact: the bf16 bits become the float32's high half.
    for i in range(positions.size):
        p = positions[i]
        target[p] = np.uint32(np.uint16(source[p])) << 16


def copy_at(positions: np.ndarray, source: np.ndarray, target: np.ndarray) -> None:
    """Copy the bf16 elements at ``positions`` (int64, any order, repeats allowed) of
    ``source`` (flat int16 bits) into ``target``: flat uint16 bits of a bf16 tensor, or
    uint32 bits of a float32 one (widened exactly). One pass over the positions, no gathered
    copy: an engine's copy taking a version's changed elements (``HFEngine.prepare_weights``).
    Raises ``ValueError`` on a position outside either array, before writing."""
    if source.dtype != np.int16 or target.dtype not in (np.uint16, np.uint32):
        raise ValueError(f"copy_at: {source.dtype} into {target.dtype}")
    if positions.size and (
        int(positions.min()) < 0 or int(positions.max()) >= min(source.size, target.size)
    ):
        raise ValueError(f"copy_at: a position outside {min(source.size, target.size)} elements")
    if target.dtype == np.uint16:
        _copy_at(positions, source.view(np.uint16), target)
    else:
        _widen_at(positions, source, target)
